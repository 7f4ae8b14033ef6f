//! The Kubernetes Events a status change records on its policy (the guide:
//! `docs/src/reference/errors.md`).

use kube::runtime::events::{Event, EventType};
use kube::Resource;
use reprise_crds::resource::RetryPolicy;

use super::conditions::{find, has_reason, ConditionType, Reason};
use super::status::Evaluation;
use super::Context;
use crate::telemetry::ReconcileSpan;

/// Longest Event note: the validation message can be long.
const MAX_NOTE_CHARS: usize = 1000;

/// Records the Events the change from `policy`'s status to `eval`'s calls
/// for: `Accepted` or `Rejected` when the verdict changed, `InSync` when
/// every selected sidecar came to run the policy.
pub(crate) async fn status_changed(
    ctx: &Context,
    policy: &RetryPolicy,
    eval: &Evaluation,
    span: &mut ReconcileSpan,
) {
    let before = policy.status.as_ref();
    let after = Some(&eval.status);
    let was_accepted = find(before, ConditionType::Accepted).map(|c| c.status == "True");
    if was_accepted != Some(eval.accepted) {
        let (type_, reason) = if eval.accepted {
            (EventType::Normal, "Accepted")
        } else {
            (EventType::Warning, "Rejected")
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: find(after, ConditionType::Accepted)
                .map(|c| c.message.chars().take(MAX_NOTE_CHARS).collect()),
            action: "Validate".into(),
            secondary: None,
        };
        publish(ctx, policy, &event, span).await;
    }
    let in_sync = |s| has_reason(s, ConditionType::InSync, Reason::AllSidecarsInSync);
    if !in_sync(before) && in_sync(after) {
        let event = Event {
            type_: EventType::Normal,
            reason: "InSync".into(),
            note: find(after, ConditionType::InSync).map(|c| c.message.clone()),
            action: "Push".into(),
            secondary: None,
        };
        publish(ctx, policy, &event, span).await;
    }
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
