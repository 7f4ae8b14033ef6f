//! The span of one reconcile: which policy, what the verdict was, how many
//! endpoints and sidecars it saw, and what it wrote.

use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::Span;
use opentelemetry_semantic_conventions::attribute::{ERROR_TYPE, K8S_NAMESPACE_NAME};
use reprise_crds::resource::RetryPolicy;
use reprise_telemetry::Tracing;

use crate::sidecars::SyncCounts;
use crate::Error;

/// The span's name.
pub(crate) const NAME: &str = "reconcile";
/// The RetryPolicy's name (its namespace is `k8s.namespace.name`).
pub(crate) const POLICY: &str = "reprise.policy";
/// The RetryPolicy's `metadata.generation`.
pub(crate) const GENERATION: &str = "reprise.policy.generation";
/// `accepted`, `rejected` (invalid, or its target does not resolve) or `error`
/// (the reconcile failed and will be retried).
pub(crate) const RESULT: &str = "reprise.reconcile.result";
/// Ready endpoints of the policy's target.
pub(crate) const ENDPOINTS: &str = "reprise.endpoints";
/// Connected sidecars the policy selects (all replicas).
pub(crate) const SIDECARS_SELECTED: &str = "reprise.sidecars.selected";
/// Of those, how many ACKed the policy's current generation.
pub(crate) const SIDECARS_IN_SYNC: &str = "reprise.sidecars.in_sync";
/// The Kubernetes Event's reason, e.g. `Accepted` (`event_recorded` event).
pub(crate) const EVENT_REASON: &str = "reprise.event.reason";
/// `Normal` or `Warning` (`event_recorded` event).
pub(crate) const EVENT_TYPE: &str = "reprise.event.type";

/// The INTERNAL span of one reconcile; ends with [`ReconcileSpan::end`].
#[derive(Debug)]
pub(crate) struct ReconcileSpan(Option<Inner>);

#[derive(Debug)]
struct Inner {
    span: Span,
    /// The verdict, once evaluated: the result unless the reconcile then fails.
    accepted: Option<bool>,
    /// What the verdict was based on, recorded when the reconcile succeeds.
    based_on: Vec<KeyValue>,
}

impl ReconcileSpan {
    /// A span that records nothing.
    pub(crate) fn off() -> Self {
        ReconcileSpan(None)
    }

    /// Starts the span of one reconcile of `policy`; records nothing while
    /// `tracing` is off.
    pub(crate) fn start(tracing: &Tracing, policy: &RetryPolicy) -> Self {
        let Some(tracer) = tracing.tracer() else {
            return Self::off();
        };
        let mut attributes = Vec::with_capacity(3);
        if let Some(ns) = &policy.metadata.namespace {
            attributes.push(KeyValue::new(K8S_NAMESPACE_NAME, ns.clone()));
        }
        if let Some(name) = &policy.metadata.name {
            attributes.push(KeyValue::new(POLICY, name.clone()));
        }
        if let Some(generation) = policy.metadata.generation {
            attributes.push(KeyValue::new(GENERATION, generation));
        }
        // A root span: nothing upstream of a watch event carries trace context.
        let span = tracer
            .span_builder(NAME)
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes)
            .start(tracer);
        ReconcileSpan(Some(Inner {
            span,
            accepted: None,
            based_on: Vec::new(),
        }))
    }

    /// Records the verdict (`accepted`) and what it was based on: the
    /// target's ready `endpoints` and the sidecars' sync `counts`. A
    /// reconcile that then fails (its status write refused) concluded
    /// nothing: its span carries the error, not these. Plain values rather
    /// than the reconciler's evaluation: spans sit below the reconciler.
    pub(crate) fn evaluated(&mut self, accepted: bool, endpoints: i32, counts: SyncCounts) {
        let Some(inner) = &mut self.0 else {
            return;
        };
        inner.accepted = Some(accepted);
        inner.based_on = vec![
            KeyValue::new(ENDPOINTS, i64::from(endpoints)),
            KeyValue::new(SIDECARS_SELECTED, i64::from(counts.selected)),
            KeyValue::new(SIDECARS_IN_SYNC, i64::from(counts.in_sync)),
        ];
    }

    /// The status changed and was written.
    pub(crate) fn status_written(&mut self) {
        if let Some(inner) = &mut self.0 {
            inner.span.add_event("status_written", Vec::new());
        }
    }

    /// A Kubernetes Event was recorded on the policy.
    pub(crate) fn event_recorded(&mut self, event_type: &'static str, reason: &str) {
        if let Some(inner) = &mut self.0 {
            inner.span.add_event(
                "event_recorded",
                vec![
                    KeyValue::new(EVENT_TYPE, event_type),
                    KeyValue::new(EVENT_REASON, reason.to_string()),
                ],
            );
        }
    }

    /// Ends the span with the reconcile's result.
    pub(crate) fn end<T>(mut self, result: &Result<T, Error>) {
        let Some(mut inner) = self.0.take() else {
            return;
        };
        let outcome = match (result, inner.accepted) {
            (Err(e), _) => {
                inner
                    .span
                    .set_attribute(KeyValue::new(ERROR_TYPE, error_type(e)));
                inner.span.set_status(Status::error(e.to_string()));
                "error"
            }
            (Ok(_), accepted) => {
                inner
                    .span
                    .set_attributes(std::mem::take(&mut inner.based_on));
                match accepted {
                    Some(true) => "accepted",
                    Some(false) => "rejected",
                    // Not reached today: every successful reconcile evaluates.
                    None => "unknown",
                }
            }
        };
        inner.span.set_attribute(KeyValue::new(RESULT, outcome));
        inner.span.end();
    }
}

/// A low-cardinality name for what failed: the API's reason (`Conflict`,
/// `Forbidden`, ...) or HTTP status when it answered, `kube_client` when the
/// client failed before an answer, else [`Error::metric_label`].
fn error_type(error: &Error) -> String {
    match error {
        Error::Kube(kube::Error::Api(status)) if !status.reason.is_empty() => status.reason.clone(),
        Error::Kube(kube::Error::Api(status)) => status.code.to_string(),
        Error::Kube(_) => "kube_client".to_string(),
        other => other.metric_label().to_string(),
    }
}
