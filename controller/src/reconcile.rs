//! The RetryPolicy reconciler: validate, resolve the target from the shared
//! [`Cache`], count the sidecars in sync, and write status by server-side
//! apply when (and only when) it changed, recording Events for the changes
//! people act on. It reads no object from the API: every read comes from the
//! cache the push streams also read. Each reconcile is one `reconcile` span
//! when tracing is on.
//!
//! - [`status`]: the status a policy should have (pure).
//! - [`conditions`]: its condition types and reasons.
//! - [`events`]: the Events a status change records.
//! - [`peers`]: sync counts across replicas.
//! - [`traffic`]: `status.traffic`, published at most once a minute.
//! - [`triggers`]: the kube `Controller` and what re-triggers a policy.
//! - [`gateway`]: the status of the Gateway API routes and budgets Reprise reads.

pub(crate) mod backend_tls;
pub(crate) mod conditions;
mod events;
pub(crate) mod gateway;
pub(crate) mod peers;
pub(crate) mod status;
pub(crate) mod traffic;
pub(crate) mod triggers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::{Api, Client, ResourceExt};
use reprise_crds::resource::{RetryPolicy, RetryPolicyStatus};

use crate::cache::Cache;
use crate::metrics::{Counter, Metrics};
use crate::sidecars::SidecarRegistry;
use crate::telemetry::{ReconcileSpan, Tracing};
use crate::{policy, Error};

/// Field manager of the controller's writes (status, sync counts).
pub(crate) const MANAGER: &str = "reprise-controller";

/// How often a policy is reconciled with nothing changed.
const RESYNC: Duration = Duration::from_secs(300);

/// What every reconcile shares: the API client and the cache it reads,
/// where it records, and the state kept between reconciles.
pub struct Context {
    /// API client, for status writes and Events.
    pub(crate) client: Client,
    /// The shared stores every read comes from.
    pub(crate) cache: Cache,
    /// Event recorder (`None`: no Events).
    pub(crate) recorder: Option<Recorder>,
    /// Controller metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// Sidecars connected to this replica and their ACKs.
    pub(crate) sidecars: Arc<SidecarRegistry>,
    /// Other replicas' sync counts (with leader election).
    pub(crate) peers: Option<peers::Peers>,
    /// Consecutive failures per policy, for error backoff.
    pub(crate) failures: Mutex<HashMap<String, u32>>,
    /// Spans of each reconcile (off: records nothing).
    pub(crate) tracing: Tracing,
    /// The traffic each policy's status reports.
    pub(crate) traffic: traffic::Published,
    /// The status last written for each policy, with the resourceVersion
    /// of the object it was computed from: until the cache holds the write,
    /// a reconcile of the same object computes the same status again, and
    /// must not write it again.
    pub(crate) written: Mutex<HashMap<String, (Option<String>, RetryPolicyStatus)>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// Reconciles from `cache`, writing through `client`, with metrics and a
    /// sidecar registry of its own, no Events and no peers.
    pub fn new(client: Client, cache: Cache, tracing: Tracing) -> Self {
        Context {
            client,
            cache,
            recorder: None,
            metrics: Arc::default(),
            sidecars: Arc::default(),
            peers: None,
            failures: Mutex::default(),
            tracing,
            traffic: traffic::Published::default(),
            written: Mutex::default(),
        }
    }

    /// Also records Kubernetes Events with `recorder`.
    pub fn with_recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// The metrics reconciles count into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

/// Reconciles one RetryPolicy. Idempotent: with nothing changed, it writes nothing.
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
    ctx.metrics.add(Counter::Reconciles);
    let namespace = policy.namespace().ok_or(Error::MissingNamespace)?;
    let target = ctx.cache.target(policy);
    let labels = |ns: &str| ctx.cache.namespace_labels(ns);
    let mut counts = ctx.sidecars.counts(policy, &labels);
    if let Some(peers) = &ctx.peers {
        counts = peers.add(counts, policy);
    }
    if let Ok(upstream) = &target {
        counts.outdated = ctx.sidecars.outdated(policy, &upstream.needs(), &labels);
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut eval = status::evaluate(policy, &target, counts, now.clone());
    eval.status.traffic = ctx.traffic.get(&policy::id(policy));
    span.evaluated(eval.accepted, eval.status.endpoints, counts);
    let id = policy::id(policy);
    let version = policy.resource_version();
    let pending = {
        let mut written = ctx.written.lock().unwrap_or_else(|e| e.into_inner());
        if policy.status.as_ref() == Some(&eval.status) {
            written.remove(&id);
        }
        written
            .get(&id)
            .is_some_and(|(seen, status)| *seen == version && *status == eval.status)
    };
    if policy.status.as_ref() != Some(&eval.status) && !pending {
        write_status(ctx, &namespace, &policy.name_any(), &eval.status).await?;
        ctx.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (version, eval.status.clone()));
        ctx.metrics.add(Counter::StatusWrites);
        span.status_written();
        events::status_changed(ctx, policy, &eval, span).await;
    }
    // The BackendTLSPolicy its target uses says whether Reprise uses it.
    backend_tls::report(ctx, policy, &now).await?;
    ctx.failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&policy::id(policy));
    Ok(Action::requeue(RESYNC))
}

/// Writes `status` by server-side apply: the controller owns the whole status.
async fn write_status(
    ctx: &Context,
    namespace: &str,
    name: &str,
    status: &RetryPolicyStatus,
) -> Result<(), Error> {
    let api: Api<RetryPolicy> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = serde_json::json!({
        "apiVersion": "reprise.dev/v1alpha1",
        "kind": "RetryPolicy",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::Kube)?;
    Ok(())
}

/// Logs, counts (by [`Error::metric_label`]) and requeues with per-policy
/// exponential backoff (1 s doubling to 5 min).
pub fn error_policy(policy: Arc<RetryPolicy>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(error);
    let key = policy::id(&policy);
    let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
    let n = failures.entry(key.clone()).or_insert(0);
    *n = n.saturating_add(1);
    let delay = Duration::from_secs(1u64 << (*n - 1).min(8)).min(RESYNC);
    tracing::warn!(policy = %key, error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
