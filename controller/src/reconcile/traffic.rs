//! `status.traffic` as the leader writes it: every [`PUBLISH_EVERY`] it adds
//! up what the sidecars connected to this replica and to its peers reported
//! of each policy over the window, and re-triggers the reconcile of the
//! policies whose traffic changed; a reconcile writes the traffic last
//! published here. So a policy's traffic reaches the API server at most once
//! a minute and only when it changed: the API server is not a metrics store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use reprise_crds::resource::TrafficStatus;

use super::Context;
use crate::policy;
use crate::traffic::{self, WindowTotal};

/// How often the traffic is added up and, where it changed, written.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_secs(60);

/// The traffic last published for each policy (`namespace/name`).
#[derive(Debug, Default)]
pub(crate) struct Published {
    statuses: Mutex<HashMap<String, TrafficStatus>>,
    /// Told when a route rule's traffic changed: the Gateway API status
    /// writer (`gateway.rs`) writes it then, not at its next resync.
    pub(crate) routes_changed: tokio::sync::Notify,
}

impl Published {
    /// What `status.traffic` of policy `id` says now.
    pub(crate) fn get(&self, id: &str) -> Option<TrafficStatus> {
        lock(&self.statuses).get(id).cloned()
    }

    /// Takes `total` (none: nothing reported in the window) as policy
    /// `id`'s traffic at `observed_at`; true when that changed what its
    /// status says.
    pub(crate) fn offer(&self, id: &str, total: Option<WindowTotal>, observed_at: &str) -> bool {
        let mut statuses = lock(&self.statuses);
        let next = match (total, statuses.get(id)) {
            (Some(total), _) => traffic::status(&total, observed_at.to_string()),
            // Quiet since the last publication: say so rather than keep
            // numbers that no longer describe anything.
            (None, Some(_)) => traffic::status(&WindowTotal::default(), observed_at.to_string()),
            (None, None) => return false,
        };
        if statuses
            .get(id)
            .is_some_and(|prev| traffic::same_traffic(prev, &next))
        {
            return false;
        }
        statuses.insert(id.to_string(), next);
        true
    }
}

/// Every [`PUBLISH_EVERY`], the policies whose traffic changed.
pub(crate) fn changes(ctx: Arc<Context>) -> impl Stream<Item = String> + Send + 'static {
    let ticks = tokio_stream_interval(PUBLISH_EVERY);
    futures_util::StreamExt::flat_map(ticks, move |()| futures_util::stream::iter(changed(&ctx)))
}

/// Adds up each policy's traffic now; the ids whose published traffic changed.
fn changed(ctx: &Context) -> Vec<String> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let observed_at = now.to_string();
    let mut out = Vec::new();
    // The peers' reports, read once for every policy.
    let peers = ctx
        .peers
        .as_ref()
        .map(|p| p.all_traffic())
        .unwrap_or_default();
    for p in ctx.cache.policies() {
        let id = policy::id(&p);
        let mut total = ctx.sidecars.traffic().window(&id, now.as_second());
        if let Some(peer) = peers.get(&id) {
            total.get_or_insert_with(WindowTotal::default).add(peer);
        }
        if ctx.traffic.offer(&id, total, &observed_at) {
            out.push(id);
        }
    }
    // Route rules: their traffic goes in the routes' status, which the
    // Gateway API status writer reads from here (`gateway.rs`).
    for v in ctx.cache.route_verdicts(None) {
        for (_, id) in crate::cache::routes::rule_ids(&v) {
            let mut total = ctx.sidecars.traffic().window(&id, now.as_second());
            if let Some(peer) = peers.get(&id) {
                total.get_or_insert_with(WindowTotal::default).add(peer);
            }
            if ctx.traffic.offer(&id, total, &observed_at) {
                ctx.traffic.routes_changed.notify_one();
            }
        }
    }
    out
}

/// A tick every `period`, the first after one period.
fn tokio_stream_interval(period: Duration) -> impl Stream<Item = ()> + Send + 'static {
    futures_util::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some(((), ()))
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reprise_crds::traffic::TrafficCounts;

    fn total(requests: u64, success: u64) -> Option<WindowTotal> {
        Some(WindowTotal {
            counts: TrafficCounts {
                requests,
                success,
                ..TrafficCounts::default()
            },
            sidecars: 1,
        })
    }

    #[test]
    fn traffic_is_published_when_it_changes_and_only_then() {
        let p = Published::default();
        assert!(
            !p.offer("ns/p", None, "t0"),
            "nothing reported, nothing to say"
        );
        assert!(p.get("ns/p").is_none());
        assert!(p.offer("ns/p", total(10, 9), "t1"));
        assert_eq!(
            p.get("ns/p").map(|s| s.effective_success),
            Some("90.00%".into())
        );
        assert!(
            !p.offer("ns/p", total(10, 9), "t2"),
            "the same traffic a minute later"
        );
        assert_eq!(p.get("ns/p").map(|s| s.observed_at), Some("t1".into()));
        assert!(p.offer("ns/p", total(20, 20), "t3"));
        // Every sidecar went quiet: the status says so once.
        assert!(p.offer("ns/p", None, "t4"));
        assert_eq!(p.get("ns/p").map(|s| s.requests), Some(0));
        assert!(!p.offer("ns/p", None, "t5"));
    }
}
