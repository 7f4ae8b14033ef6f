//! The RetryPolicy reconciler: validate, resolve the target, count sidecars in
//! sync, and write status by server-side apply when (and only when) it changed.
//! Each reconcile is one `reconcile` span when tracing is on.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use reprise_crds::resource::RetryPolicy;

use crate::metrics::Metrics;
use crate::sidecars::SidecarRegistry;
use crate::telemetry::{ReconcileSpan, Tracing};
use crate::{endpoints, status, Error};

/// Field manager for status writes.
pub const MANAGER: &str = "reprise-controller";

/// What every reconcile shares.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Event recorder (absent in tests).
    pub recorder: Option<Recorder>,
    /// Controller metrics.
    pub metrics: Arc<Metrics>,
    /// Connected sidecars and their ACKs.
    pub sidecars: Arc<SidecarRegistry>,
    /// Consecutive failures per policy, for error backoff.
    pub failures: Mutex<HashMap<String, u32>>,
    /// Other replicas' sync counts (with leader election), and this replica's identity.
    pub peers: Option<(
        kube::runtime::reflector::Store<k8s_openapi::api::core::v1::ConfigMap>,
        String,
    )>,
    /// Spans of each reconcile (off: records nothing).
    pub tracing: Tracing,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

/// Reconciles one RetryPolicy. Idempotent: with nothing changed, it reads and writes nothing else.
pub async fn reconcile(policy: Arc<RetryPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let mut span = ReconcileSpan::start(&ctx.tracing, &policy);
    let result = reconcile_policy(&policy, &ctx, &mut span).await;
    span.end(&result);
    result
}

async fn reconcile_policy(
    policy: &RetryPolicy,
    ctx: &Context,
    span: &mut ReconcileSpan,
) -> Result<Action, Error> {
    ctx.metrics.reconciles.fetch_add(1, Ordering::Relaxed);
    let ns = policy.namespace().ok_or(Error::MissingNamespace)?;
    let name = policy.name_any();
    let target = &policy.spec.target_ref.name;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let service = services.get_opt(target).await.map_err(Error::Kube)?;
    let slices = if service.is_some() {
        let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &ns);
        let params = ListParams::default().labels(&format!("kubernetes.io/service-name={target}"));
        api.list(&params).await.map_err(Error::Kube)?.items
    } else {
        Vec::new()
    };
    let resolved = endpoints::resolve(service.as_ref(), &slices, policy.spec.target_ref.port, &ns);
    let mut counts = ctx.sidecars.counts(policy);
    if let Some((store, me)) = &ctx.peers {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        counts = crate::peers::total(counts, policy, &crate::peers::reports(store, me), now);
    }

    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let eval = status::evaluate(policy, &resolved, counts, now);
    span.evaluated(&eval, counts);
    if policy.status.as_ref() != Some(&eval.status) {
        let was_accepted = policy
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Accepted"))
            .map(|c| c.status == "True");
        let api: Api<RetryPolicy> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = serde_json::json!({
            "apiVersion": "reprise.dev/v1alpha1",
            "kind": "RetryPolicy",
            "status": eval.status,
        });
        api.patch_status(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::Kube)?;
        ctx.metrics.status_writes.fetch_add(1, Ordering::Relaxed);
        span.status_written();
        if was_accepted != Some(eval.accepted) {
            publish_verdict(ctx, policy, &eval, span).await;
        }
        let synced = |s: Option<&reprise_crds::resource::RetryPolicyStatus>| {
            s.and_then(|s| s.conditions.iter().find(|c| c.type_ == "InSync"))
                .is_some_and(|c| c.reason == "AllSidecarsInSync")
        };
        if !synced(policy.status.as_ref()) && synced(Some(&eval.status)) {
            let event = Event {
                type_: EventType::Normal,
                reason: "InSync".into(),
                note: eval.status.conditions.get(1).map(|c| c.message.clone()),
                action: "Push".into(),
                secondary: None,
            };
            publish(ctx, policy, &event, span).await;
        }
    }
    ctx.failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&format!("{ns}/{name}"));
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Records `event` on the policy. A failure is logged, not returned: the
/// status already says the same.
async fn publish(ctx: &Context, policy: &RetryPolicy, event: &Event, span: &mut ReconcileSpan) {
    let Some(recorder) = &ctx.recorder else {
        return;
    };
    match recorder.publish(event, &policy.object_ref(&())).await {
        Ok(()) => span.event_recorded(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            },
            &event.reason,
        ),
        Err(e) => tracing::warn!(error = %e, "cannot publish event"),
    }
}

async fn publish_verdict(
    ctx: &Context,
    policy: &RetryPolicy,
    eval: &status::Evaluation,
    span: &mut ReconcileSpan,
) {
    let accepted = eval.status.conditions.first();
    let event = Event {
        type_: if eval.accepted {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: if eval.accepted {
            "Accepted".into()
        } else {
            "Rejected".into()
        },
        note: accepted.map(|c| c.message.chars().take(1000).collect()),
        action: "Validate".into(),
        secondary: None,
    };
    publish(ctx, policy, &event, span).await;
}

/// Logs, counts and requeues with per-policy exponential backoff (1 s doubling to 5 min).
pub fn error_policy(policy: Arc<RetryPolicy>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_errors.fetch_add(1, Ordering::Relaxed);
    let key = format!(
        "{}/{}",
        policy.namespace().unwrap_or_default(),
        policy.name_any()
    );
    let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
    let n = failures.entry(key.clone()).or_insert(0);
    *n = n.saturating_add(1);
    let delay = Duration::from_secs(1u64 << (*n - 1).min(8)).min(Duration::from_secs(300));
    tracing::warn!(policy = %key, error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
