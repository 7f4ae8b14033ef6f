//! The deadline phase (`docs/src/tasks/deadlines.md`): what a deadline
//! that came with the request, in the `baggage` its application forwarded,
//! does to it, and whether its attempts carry one on to the next hop.
//!
//! - A request's switches are the sidecar's (`proxy.deadlines`, the
//!   `reprise.dev/deadline-*` annotations) and its policy's: either may turn
//!   a way off. They apply to requests no rule matches too.
//! - Accepted ([`received`]): the entry is read only when a `baggage` field
//!   came, with one wall clock read; an ignored entry is counted and on the
//!   span, never a failure. An accepted deadline that has passed makes the
//!   retry loop answer `504` at once, with nothing buffered or sent.
//! - Carried on ([`onward`]): when a deadline came, or the policy sets a
//!   total deadline or an attempt timeout, or the gRPC client its
//!   `grpc-timeout`; never towards an upstream of DNS-named endpoints
//!   (ExternalName Services, hosts outside the cluster). With no deadline
//!   anywhere nothing is read but the lookup of `baggage`, and nothing is
//!   written.
//! - Once across layers ([`once_across_layers`], a policy's `retry_layers:
//!   once`): a request marked as an upper layer's retry is not retried, and
//!   the policy's own retries and hedges carry the mark.

use reprise_crds::policy::DeadlinePolicy;
use reprise_crds::RetryPolicy;
use tokio::time::Instant;

use super::admit::Admission;
use crate::clock;
use crate::exchange::deadline::{self, Hops, Received};
use crate::exchange::outcome::SkipReason;
use crate::observe::spans::RequestSpan;
use crate::retry::attempt::RequestTemplate;
use crate::retry::upstream::UpstreamState;

/// The switches of a request under `policy` on a sidecar set to `sidecar`.
pub(crate) fn switches(sidecar: DeadlinePolicy, policy: Option<&RetryPolicy>) -> DeadlinePolicy {
    policy.map_or(sidecar, |p| sidecar.and(p.deadlines))
}

/// A request under a policy that retries once across layers: not retried
/// when it is an upper layer's retry (a reason known up front wins), and
/// its retries marked.
pub(crate) fn once_across_layers(admitted: &mut Admission<'_>, template: &mut RequestTemplate) {
    if deadline::has_retry_mark(&template.head.headers) {
        admitted
            .plan
            .skip
            .get_or_insert(SkipReason::UpperLayerRetry);
    }
    template.mark_retries = true;
}

/// The deadline that came in `headers`, when it is accepted: counted by
/// `upstream`'s metrics and recorded on `span` either way.
pub(crate) fn received(
    headers: &http::HeaderMap,
    switches: DeadlinePolicy,
    upstream: &UpstreamState,
    span: &RequestSpan,
) -> Option<Hops> {
    if !switches.accept_incoming || !deadline::has_baggage(headers) {
        return None;
    }
    let (wall, at) = (clock::unix_ms(), Instant::now());
    match deadline::read(headers, wall) {
        Received::Absent => None,
        Received::Ignored(why) => {
            upstream.metrics.record_deadline_received(Some(why));
            span.deadline_received(why.name(), None);
            None
        }
        Received::Valid(ms) => {
            upstream.metrics.record_deadline_received(None);
            let left = i64::try_from(ms).unwrap_or(i64::MAX) - i64::try_from(wall).unwrap_or(0);
            span.deadline_received("accepted", Some(left));
            Some(Hops::new(wall, at, Some(ms), false))
        }
    }
}

/// The request's deadline across hops as the retry loop runs it: the one
/// `received`, and whether attempts carry the request's on (`switches`,
/// and an upstream not named by DNS), when either applies.
pub(crate) fn onward(
    received: Option<Hops>,
    switches: DeadlinePolicy,
    upstream: &UpstreamState,
    policy: Option<&RetryPolicy>,
    grpc_deadline: Option<Instant>,
) -> Option<Box<Hops>> {
    let propagate = switches.propagate && upstream.config.dns.is_empty();
    match received {
        Some(mut hops) => {
            hops.propagate = propagate;
            Some(Box::new(hops))
        }
        None if propagate
            && (grpc_deadline.is_some()
                || policy.is_some_and(|p| {
                    p.total_deadline.is_some() || p.attempt_timeout.is_some()
                })) =>
        {
            Some(Box::new(Hops::new(
                clock::unix_ms(),
                Instant::now(),
                None,
                true,
            )))
        }
        None => None,
    }
}
