//! What one attempt's result means, and the one place it is observed.
//!
//! [`classify`] is pure: a response whose status the policy retries, or a
//! transport error, is a failure; any other response is final. [`observe`]
//! then applies every side effect of the attempt in one step: passive health
//! (transport failures only: a status proves the transport works), the
//! endpoint's failure estimate (retryable statuses and transport failures
//! both weigh it), the attempt's span, the latency histogram and the report.

use hyper::body::Incoming;
use reprise_crds::RetryPolicy;

use super::attempt::Attempted;
use super::failure::{self, Failure, Stage};
use super::{Report, RetryState};
use crate::balance::upstream::UpstreamState;
use crate::observe::spans::AttemptSpan;

/// What an attempt's result means for the request.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// A response to pass on.
    Final(http::Response<Incoming>),
    /// A failure for the gates to judge.
    Failed(Failure<Incoming>),
}

/// Classifies `result` under `policy`, touching nothing.
pub(crate) fn classify(
    result: Result<http::Response<Incoming>, (failure::FailureKind, Stage)>,
    policy: Option<&RetryPolicy>,
) -> Verdict {
    match result {
        Ok(response) => {
            let status = response.status().as_u16();
            if policy.is_some_and(|p| p.retry_statuses.contains(status)) {
                Verdict::Failed(Failure {
                    kind: failure::FailureKind::UpstreamStatus(status),
                    stage: Stage::Response,
                    retry_after: failure::retry_after(response.headers()),
                    response: Some(response),
                })
            } else {
                Verdict::Final(response)
            }
        }
        Err((kind, stage)) => Verdict::Failed(Failure {
            kind,
            stage,
            response: None,
            retry_after: None,
        }),
    }
}

/// True when `attempted` would be final under `policy` (the hedge race asks
/// before deciding which attempt to keep).
pub(crate) fn is_final(attempted: &Attempted, policy: Option<&RetryPolicy>) -> bool {
    match &attempted.result {
        Ok(r) => !policy.is_some_and(|p| p.retry_statuses.contains(r.status().as_u16())),
        Err(_) => false,
    }
}

/// Records what `verdict` says about the attempt to `endpoint`.
pub(crate) fn observe(
    up: &UpstreamState,
    endpoint: usize,
    verdict: &Verdict,
    span: AttemptSpan,
    report: &mut Report,
) {
    let state = &up.endpoints[endpoint];
    match verdict {
        Verdict::Final(response) => {
            state.record_success();
            state.record_outcome(false);
            span.responded(response.status().as_u16());
        }
        Verdict::Failed(f) => {
            match &f.response {
                Some(response) => {
                    // Any response proves the transport works; a retryable
                    // status weighs the endpoint's choice, never its health.
                    state.record_success();
                    state.record_outcome(true);
                    span.failed(f.kind, Some(response.status().as_u16()));
                }
                None => {
                    span.failed(f.kind, None);
                    if f.kind.is_transport() {
                        state.record_outcome(true);
                        state.record_failure(&up.config.passive_health);
                    }
                }
            }
            report.first_error.get_or_insert(f.kind);
        }
    }
}

/// Classifies and observes one finished attempt of the request `state` runs.
pub(crate) fn settle(state: &mut RetryState<'_>, attempted: Attempted) -> Verdict {
    let up = state.up;
    up.metrics.record_attempt(attempted.elapsed);
    let verdict = classify(attempted.result, state.plan.policy);
    observe(
        up,
        attempted.endpoint,
        &verdict,
        attempted.span,
        &mut state.report,
    );
    verdict
}
