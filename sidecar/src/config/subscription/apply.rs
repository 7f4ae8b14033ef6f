//! What a subscription runs, and how each line of the push stream changes
//! it: a whole snapshot is validated with the shared rules and swapped in; a
//! delta is applied to the snapshot last received and checked against the
//! version it announces. A delta that only moves endpoints (a rolling
//! restart's every step) is patched into the running routes at the cost of
//! the change ([`Proxy::patch_endpoints`]): the other upstreams, the
//! rules and every endpoint that stays are not touched. Any other delta
//! resolves the whole result, as a whole snapshot does.
//!
//! The last good snapshot is kept whole on disk for restarts while the
//! controller is away. A whole snapshot is written as it came; under a
//! stream of deltas it is written at most once a second ([`SAVE_EVERY`]),
//! when the stream ends, and before any line that could be refused is
//! applied, so that a sidecar following a rolling restart does not encode
//! and write its snapshot twenty times a second, and the file always holds
//! the last good snapshot, whole.

use std::path::Path;
use std::time::Duration;

use reprise_crds::protocol::{Ack, Resync};
use reprise_crds::snapshot::{DeltaLine, Entries, Snapshot, SnapshotDelta};
use reprise_crds::traffic::SidecarLine;
use tokio::time::Instant;

use super::Subscription;
use crate::proxy::route::EndpointsChange;
use crate::proxy::Proxy;

/// How often, at most, a stream of deltas writes the snapshot to disk.
pub const SAVE_EVERY: Duration = Duration::from_secs(1);

/// What a subscription runs, across its connections.
#[derive(Clone, Debug, Default)]
pub struct Running {
    /// The version the proxy runs (resumed on reconnection).
    pub version: Option<String>,
    /// The snapshot last received, as entries: what a delta applies to.
    entries: Option<Entries>,
    /// The proxy runs `entries`: the last line was accepted, so an
    /// endpoint patch applies to the running routes.
    installed: bool,
    /// When the snapshot was last written.
    saved_at: Option<Instant>,
    /// The proxy runs a snapshot newer than the one written.
    unsaved: bool,
}

impl Running {
    /// Running `version` (its entries unknown: a delta then asks for the
    /// whole snapshot).
    pub fn version(version: Option<String>) -> Self {
        Running {
            version,
            ..Running::default()
        }
    }

    /// Running `snapshot`, as saved.
    pub fn snapshot(snapshot: Snapshot) -> Self {
        Running {
            version: Some(snapshot.version.clone()),
            entries: Some(Entries::from_snapshot(snapshot)),
            installed: true,
            saved_at: None,
            unsaved: false,
        }
    }

    /// When the snapshot the proxy runs is due on disk, if it is not there.
    pub(super) fn save_due(&self) -> Option<Instant> {
        self.unsaved.then(|| {
            self.saved_at
                .map_or_else(Instant::now, |at| at + SAVE_EVERY)
        })
    }
}

impl Subscription {
    /// Validates and applies one whole snapshot line; returns the ACK or NACK.
    pub(super) fn apply(&self, proxy: &Proxy, line: &[u8], running: &mut Running) -> Ack {
        let snapshot: Snapshot = match serde_json::from_slice(line) {
            Ok(s) => s,
            Err(e) => {
                return Ack {
                    version: String::new(),
                    error: Some(format!("snapshot is not valid JSON: {e}")),
                }
            }
        };
        // It may be refused: the snapshot running now goes to disk first.
        self.save_running(running);
        // What deltas will apply to: what was sent, even if refused (the
        // controller's next delta starts from it).
        running.entries = Some(Entries::from_snapshot(snapshot.clone()));
        let ack = self.install(proxy, snapshot.resolve(), &snapshot.version, running);
        if ack.error.is_none() {
            // As it came: nothing to encode.
            self.save(line, running);
        }
        ack
    }

    /// Applies one delta line to the snapshot last received; returns the
    /// ACK or NACK, or, when the delta does not fit that snapshot, the
    /// request for the whole one.
    pub(super) fn apply_delta(
        &self,
        proxy: &Proxy,
        line: &[u8],
        running: &mut Running,
    ) -> SidecarLine {
        let resync = |version: Option<&str>, reason: String| {
            tracing::warn!(reason = %reason, "snapshot delta does not apply; asking for the whole snapshot");
            SidecarLine::Resync {
                resync: Resync {
                    version: version.unwrap_or_default().to_string(),
                    reason,
                },
            }
        };
        let delta = match serde_json::from_slice::<DeltaLine>(line) {
            Ok(d) => d.delta,
            Err(e) => {
                return resync(
                    running.version.as_deref(),
                    format!("not a valid delta: {e}"),
                )
            }
        };
        let Some(entries) = running.entries.as_ref() else {
            return resync(
                running.version.as_deref(),
                "no snapshot received on this stream to apply it to".into(),
            );
        };
        // An endpoints-only delta whose endpoints resolve is patched into
        // the running routes; the endpoints removed are found before the
        // delta moves them.
        let removed = (running.installed && only_endpoints(&delta) && self.resolves(&delta))
            .then(|| removed_positions(entries, &delta, self))
            .flatten();
        if removed.is_none() {
            // Resolved whole, it may be refused: the snapshot running now
            // is the last good one, so it goes to disk first.
            self.save_running(running);
        }
        let Some(entries) = running.entries.as_mut() else {
            return resync(
                running.version.as_deref(),
                "no snapshot to apply it to".into(),
            );
        };
        if let Err(e) = entries.apply(&delta) {
            // Nothing changed, but the next delta would not fit either.
            self.save_running(running);
            running.entries = None;
            return resync(running.version.as_deref(), e.to_string());
        }
        if let Some(changes) = removed.and_then(|r| self.endpoint_changes(entries, &delta, r)) {
            if proxy.patch_endpoints(&changes) {
                proxy.set_ready(true);
                tracing::debug!(version = %delta.version, upstreams = changes.len(), "snapshot delta patched in");
                running.version = Some(delta.version.clone());
                running.unsaved = true;
                self.save_if_due(running);
                return SidecarLine::Ack(Ack {
                    version: delta.version,
                    error: None,
                });
            }
        }
        let snapshot = entries.to_snapshot();
        let ack = self.install(
            proxy,
            snapshot.resolve_unversioned(),
            &snapshot.version,
            running,
        );
        if ack.error.is_none() {
            running.unsaved = true;
            self.save_if_due(running);
        }
        SidecarLine::Ack(ack)
    }

    /// The patches of an endpoints-only delta, resolved and positioned as
    /// the running configuration holds them, from the entries it gave and
    /// the positions of what it removed; `None` when an upstream is not there.
    fn endpoint_changes(
        &self,
        entries: &Entries,
        delta: &SnapshotDelta,
        mut removed: Vec<Vec<(usize, reprise_crds::Endpoint)>>,
    ) -> Option<Vec<EndpointsChange>> {
        let mut changes = Vec::with_capacity(delta.endpoints.len());
        for (patch, removed) in delta.endpoints.iter().zip(removed.iter_mut()) {
            let entry = entries.upstreams.get(&patch.upstream)?;
            let mut added = Vec::with_capacity(patch.added.len());
            for e in &patch.added {
                added.push((entry.position(e), self.endpoint(e)?));
            }
            added.sort_by_key(|(at, _)| *at);
            changes.push(EndpointsChange {
                upstream: patch.upstream.clone(),
                added,
                removed: std::mem::take(removed),
            });
        }
        Some(changes)
    }

    /// Every endpoint `delta` adds resolves.
    fn resolves(&self, delta: &SnapshotDelta) -> bool {
        delta
            .endpoints
            .iter()
            .flat_map(|p| &p.added)
            .all(|e| e.resolve().is_ok())
    }

    /// `e` as the proxy dials it: resolved, and its address mapped.
    fn endpoint(
        &self,
        e: &reprise_crds::snapshot::SnapshotEndpoint,
    ) -> Option<reprise_crds::Endpoint> {
        let mut endpoint = e.resolve().ok()?;
        if let Some(map) = &self.address_map {
            endpoint.addr.set_ip(map.map(endpoint.addr.ip()));
        }
        Some(endpoint)
    }

    /// Swaps in a resolved configuration, or refuses it.
    fn install(
        &self,
        proxy: &Proxy,
        resolved: Result<reprise_crds::Config, reprise_crds::ValidationErrors>,
        version: &str,
        running: &mut Running,
    ) -> Ack {
        match resolved {
            Ok(mut config) => {
                self.adjust(&mut config);
                let (upstreams, rules) = (config.upstreams.len(), config.rules.len());
                proxy.reload(config);
                proxy.set_ready(true);
                tracing::info!(version = %version, upstreams, rules, "snapshot applied");
                running.version = Some(version.to_string());
                running.installed = true;
                Ack {
                    version: version.to_string(),
                    error: None,
                }
            }
            Err(e) => {
                proxy
                    .metrics
                    .reloads_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(version = %version, error = %e, "snapshot refused; keeping the running configuration");
                // What runs is no longer what deltas apply to; it was
                // written before a line that could be refused was applied.
                running.installed = false;
                running.unsaved = false;
                Ack {
                    version: version.to_string(),
                    error: Some(e.to_string()),
                }
            }
        }
    }

    /// Writes the snapshot the proxy runs if it is due.
    pub(super) fn save_if_due(&self, running: &mut Running) {
        if running.save_due().is_some_and(|due| due <= Instant::now()) {
            self.save_running(running);
        }
    }

    /// Writes the snapshot the proxy runs, if it is not on disk yet.
    pub(super) fn save_running(&self, running: &mut Running) {
        if !running.unsaved || !running.installed {
            return;
        }
        let Some(entries) = &running.entries else {
            return;
        };
        let line = serde_json::to_vec(&entries.to_snapshot()).unwrap_or_default();
        self.save(&line, running);
    }

    fn save(&self, line: &[u8], running: &mut Running) {
        if let Err(e) = save(&self.snapshot_path, line) {
            tracing::warn!(path = %self.snapshot_path.display(), error = %e, "cannot save the snapshot");
        }
        running.saved_at = Some(Instant::now());
        running.unsaved = false;
    }
}

/// The delta changes nothing but endpoints.
fn only_endpoints(delta: &SnapshotDelta) -> bool {
    delta.upstreams.is_empty()
        && delta.removed_upstreams.is_empty()
        && delta.policies.is_empty()
        && delta.removed_policies.is_empty()
        && !delta.endpoints.is_empty()
}

/// For each patch of `delta`, the endpoints it removes with their positions
/// among the running endpoints, highest first; `None` when one is not there
/// (`Entries::apply` then refuses the delta).
fn removed_positions(
    entries: &Entries,
    delta: &SnapshotDelta,
    subscription: &Subscription,
) -> Option<Vec<Vec<(usize, reprise_crds::Endpoint)>>> {
    delta
        .endpoints
        .iter()
        .map(|patch| {
            let entry = entries.upstreams.get(&patch.upstream)?;
            let mut removed = patch
                .removed
                .iter()
                .map(|e| Some((entry.position(e), subscription.endpoint(e)?)))
                .collect::<Option<Vec<_>>>()?;
            // Twins share a position: each removal shifts the next into it.
            removed.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
            Some(removed)
        })
        .collect()
}

/// Writes atomically: a crash mid-write never leaves a torn snapshot.
fn save(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

#[cfg(test)]
mod tests;
