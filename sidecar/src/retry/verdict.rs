//! What one attempt's result means, and the one place it is observed.
//!
//! [`classify`] is pure: a response whose status the policy retries, a gRPC
//! response whose `grpc-status` (in a Trailers-Only response, or in trailers
//! before any message) the policy retries, or a transport error, is a
//! failure; any other response is final. [`observe`]
//! then applies every side effect of the attempt in one step: passive health
//! (transport failures only: a status proves the transport works), the
//! endpoint's failure estimate (retryable statuses and transport failures
//! both weigh it), the attempt's span, the latency histogram and the report
//! (whose history gets every failed attempt, and an answer only once another
//! attempt was made).

use std::time::Duration;

use http::HeaderMap;
use reprise_crds::RetryPolicy;
use tokio::time::Instant;

use super::attempt::{Attempted, UpstreamBody};
use super::failure::{self, Failure, Wait};
use super::upstream::UpstreamState;
use super::RetryState;
use crate::exchange::failure::{FailureKind, Stage};
use crate::exchange::report::{AttemptEnd, AttemptRecord, Report};
use crate::observe::spans::AttemptSpan;

/// What an attempt's result means for the request.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// A response to pass on.
    Final(http::Response<UpstreamBody>),
    /// A failure for the gates to judge.
    Failed(Failure<UpstreamBody>),
}

/// The `grpc-status` a gRPC response has already given (in its headers, a
/// Trailers-Only response, or in trailers that came before any message),
/// with the fields it came in.
pub(crate) fn grpc_status(response: &http::Response<UpstreamBody>) -> Option<(u8, &HeaderMap)> {
    let code = crate::exchange::grpc::grpc_code;
    if let Some(c) = code(response.headers()) {
        return Some((c, response.headers()));
    }
    let trailers = response.body().early_trailers()?;
    code(trailers).map(|c| (c, trailers))
}

/// Why `response` is a failure under `policy`, if it is.
fn retryable(
    response: &http::Response<UpstreamBody>,
    policy: Option<&RetryPolicy>,
    grpc: bool,
) -> Option<(FailureKind, Wait)> {
    let p = policy?;
    let status = response.status().as_u16();
    if p.retry_statuses.contains(status) {
        let wait = failure::retry_after(response.headers()).map_or(Wait::Backoff, Wait::For);
        return Some((FailureKind::UpstreamStatus(status), wait));
    }
    if grpc && !p.grpc_statuses.is_empty() {
        let (code, fields) = grpc_status(response)?;
        if p.grpc_statuses.contains(code) {
            return Some((
                FailureKind::GrpcStatus(code),
                failure::grpc_pushback(fields),
            ));
        }
    }
    None
}

/// Classifies `result` under `policy` (for a gRPC request when `grpc`),
/// touching nothing.
pub(crate) fn classify(
    result: Result<http::Response<UpstreamBody>, (FailureKind, Stage)>,
    policy: Option<&RetryPolicy>,
    grpc: bool,
) -> Verdict {
    match result {
        Ok(response) => match retryable(&response, policy, grpc) {
            Some((kind, wait)) => Verdict::Failed(Failure {
                kind,
                stage: Stage::Response,
                wait,
                response: Some(response),
            }),
            None => Verdict::Final(response),
        },
        Err((kind, stage)) => Verdict::Failed(Failure {
            kind,
            stage,
            response: None,
            wait: Wait::Backoff,
        }),
    }
}

/// True when `attempted` would be final under `policy` (the hedge race asks
/// before deciding which attempt to keep).
pub(crate) fn is_final(attempted: &Attempted, policy: Option<&RetryPolicy>, grpc: bool) -> bool {
    match &attempted.result {
        Ok(r) => retryable(r, policy, grpc).is_none(),
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
    grpc: bool,
) {
    let state = &up.endpoints[endpoint];
    match verdict {
        Verdict::Final(response) => {
            state.record_success();
            state.record_outcome(false);
            span.responded(
                response.status().as_u16(),
                grpc.then(|| grpc_status(response).map(|(c, _)| c))
                    .flatten(),
            );
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
                    if let FailureKind::TlsCertificate(reason) = f.kind {
                        up.metrics.record_certificate_failure(reason);
                    }
                    if f.kind.is_transport() {
                        state.record_outcome(true);
                        state.record_failure(&up.config.passive_health);
                    }
                }
            }
            report.first_error.get_or_insert(f.kind);
            if let Some(detail) = f.kind.detail() {
                report.error_detail = Some(detail);
            }
        }
    }
}

/// Classifies and observes one finished attempt of the request `state` runs.
pub(crate) fn settle(state: &mut RetryState<'_>, attempted: Attempted) -> Verdict {
    let up = state.up;
    up.metrics.record_attempt(attempted.elapsed);
    state.report.elapsed += attempted.elapsed;
    let verdict = classify(attempted.result, state.plan.policy, state.grpc);
    // Only a failure, or an answer once another attempt was made: the
    // answer to a first attempt is the common request, which must cost
    // nothing more here.
    if state.report.attempts > 1 || !matches!(verdict, Verdict::Final(_)) {
        record(
            &mut state.report,
            attempted.endpoint,
            &verdict,
            &attempted.span,
            attempted.elapsed,
            state.grpc,
        );
    }
    observe(
        up,
        attempted.endpoint,
        &verdict,
        attempted.span,
        &mut state.report,
        state.grpc,
    );
    verdict
}

/// Adds to `report`'s history the attempt to `endpoint` that `verdict`
/// judged, ended now, `elapsed` after it was sent.
#[cold]
fn record(
    report: &mut Report,
    endpoint: usize,
    verdict: &Verdict,
    span: &AttemptSpan,
    elapsed: Duration,
    grpc: bool,
) {
    let end = match verdict {
        Verdict::Final(response) => AttemptEnd::Answered {
            status: response.status().as_u16(),
            grpc_status: grpc
                .then(|| grpc_status(response).map(|(c, _)| c))
                .flatten(),
        },
        Verdict::Failed(f) => AttemptEnd::Failed {
            kind: f.kind,
            status: f.response.as_ref().map(|r| r.status().as_u16()),
        },
    };
    let now = Instant::now();
    report.push_attempt(AttemptRecord {
        endpoint,
        end,
        started: now.checked_sub(elapsed).unwrap_or(now),
        elapsed,
        unrecorded_span: span.unrecorded_id(),
    });
}
