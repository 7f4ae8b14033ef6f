//! The kube `Controller` that runs the reconciler while this replica leads,
//! fed from the shared [`Cache`] (no watch of its own). A policy is
//! reconciled when it changes; when its target Service or one of that
//! Service's EndpointSlices changes; when a peer replica's sync counts for it
//! change; when an ACK or a disconnect changes its sync counts here; when
//! its traffic changed, at most once a minute; once at
//! start; and again whenever a store was replaced by a fresh list.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use kube::runtime::controller::{Config, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use reprise_crds::resource::RetryPolicy;

use super::peers::PeerReport;
use super::{error_policy, reconcile, Context};
use crate::cache::Cache;
use crate::policy::target::SERVICE_NAME_LABEL;

/// Triggers of one policy closer together than this run one reconcile.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Runs the reconciler until the cache's watches end. `synced` names the
/// policies (`namespace/name`) whose sync counts changed.
pub(crate) async fn run(
    cache: Cache,
    ctx: Arc<Context>,
    synced: impl Stream<Item = String> + Send + 'static,
) {
    let (by_service, by_slice, by_tls, by_namespace) =
        (cache.clone(), cache.clone(), cache.clone(), cache.clone());
    let mut controller =
        Controller::for_stream(cache.policies.touched(), cache.policies.store.clone())
            .with_config(Config::default().debounce(DEBOUNCE))
            .watches_stream(cache.services.touched(), move |svc| {
                by_service.targeting(svc.namespace().as_deref(), Some(&svc.name_any()))
            })
            .watches_stream(cache.slices.touched(), move |slice| {
                let service = slice.labels().get(SERVICE_NAME_LABEL);
                by_slice.targeting(slice.namespace().as_deref(), service.map(String::as_str))
            })
            // A Namespace's labels move producer policies' selected sidecars.
            .watches_stream(cache.namespaces.touched(), move |_| {
                by_namespace
                    .policies()
                    .iter()
                    .filter(|p| crate::policy::selection::is_producer(p))
                    .map(|p| ObjectRef::from_obj(&**p))
                    .collect::<Vec<_>>()
            })
            .watches_stream(cache.backend_tls.touched(), move |tls| {
                tls.spec
                    .target_refs
                    .iter()
                    .flat_map(|t| by_tls.targeting(tls.namespace().as_deref(), Some(&t.name)))
                    .collect::<Vec<_>>()
            });
    if let Some(peers) = &cache.peers {
        controller = controller.watches_stream(peers.touched(), |cm| {
            PeerReport::of(&cm)
                .map(|r| r.policies().filter_map(policy_ref).collect::<Vec<_>>())
                .unwrap_or_default()
        });
    }
    let synced = futures_util::stream::select(synced, super::traffic::changes(Arc::clone(&ctx)))
        .filter_map(|id| std::future::ready(policy_ref(&id)));
    let everything = futures_util::stream::once(std::future::ready(())).chain(cache.relisted());
    controller
        .reconcile_on(synced)
        .reconcile_all_on(everything)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile stream");
            }
        })
        .await;
}

/// The policy named `namespace/name`.
fn policy_ref(id: &str) -> Option<ObjectRef<RetryPolicy>> {
    let (namespace, name) = id.split_once('/')?;
    Some(ObjectRef::new(name).within(namespace))
}
