//! The outcome of one logical request: `ok`, `recovered`, `exhausted` or
//! `skipped`, with the reason (`docs/src/reference/errors.md` lists them all).

/// What the retry layer did for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Outcome {
    /// The first attempt's answer was final; no retry was needed.
    Ok,
    /// A retry produced the final answer after a retryable failure.
    Recovered,
    /// A retryable failure could not be recovered within the limits.
    Exhausted(ExhaustedBy),
    /// A failure happened but retrying it was not permitted.
    Skipped(SkipReason),
}

/// Which limit ended the retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ExhaustedBy {
    /// The policy's attempt cap.
    Attempts,
    /// The upstream's retry budget.
    Budget,
    /// The total deadline.
    Deadline,
    /// No endpoint left that this request had not tried.
    NoAlternate,
    /// The upstream asked (Retry-After) for longer than `retry_after_max_ms`.
    RetryAfterTooLong,
}

/// Why a failure was not retried at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum SkipReason {
    /// No policy with attempts applies to this request.
    RetriesOff,
    /// The method is not retried by the policy (TRACE never is).
    Method,
    /// A CONNECT tunnel: its bytes are opaque, so it is never retried.
    Tunnel,
    /// Protocol upgrades are never retried.
    Upgrade,
    /// A streamed body was already (partly) sent.
    BodyConsumed,
    /// The failure happened after the request may have reached the upstream and
    /// the policy's boundary is connection establishment.
    FailureBoundary,
    /// Transport retries are off (`retry_transport: false`).
    TransportOff,
    /// The failure is never retried (e.g. the client's own body failed).
    NotRetryable,
    /// The gRPC server asked for no retry (a negative or malformed
    /// `grpc-retry-pushback-ms`).
    Pushback,
    /// The request is already an upper layer's retry or hedge, and the
    /// policy retries once across layers (`retry_layers: once`).
    UpperLayerRetry,
}

impl Outcome {
    /// `ok`, `recovered`, `exhausted` or `skipped`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Recovered => "recovered",
            Outcome::Exhausted(_) => "exhausted",
            Outcome::Skipped(_) => "skipped",
        }
    }

    /// The reason for `exhausted` and `skipped`, else empty.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Outcome::Ok | Outcome::Recovered => "",
            Outcome::Exhausted(by) => match by {
                ExhaustedBy::Attempts => "attempts",
                ExhaustedBy::Budget => "budget",
                ExhaustedBy::Deadline => "deadline",
                ExhaustedBy::NoAlternate => "no_alternate",
                ExhaustedBy::RetryAfterTooLong => "retry_after_too_long",
            },
            Outcome::Skipped(why) => match why {
                SkipReason::RetriesOff => "retries_off",
                SkipReason::Method => "method",
                SkipReason::Tunnel => "tunnel",
                SkipReason::Upgrade => "upgrade",
                SkipReason::BodyConsumed => "body_consumed",
                SkipReason::FailureBoundary => "failure_boundary",
                SkipReason::TransportOff => "transport_off",
                SkipReason::NotRetryable => "not_retryable",
                SkipReason::Pushback => "pushback",
                SkipReason::UpperLayerRetry => "upper_layer_retry",
            },
        }
    }
}

#[cfg(test)]
mod vocabulary_tests {
    use super::*;

    /// The controller takes only the names it knows from a traffic report
    /// (`reprise_crds::traffic`): every reason a sidecar reports is one.
    /// A new reason goes into the controller's list with it.
    #[test]
    fn every_reason_is_in_the_controllers_vocabulary() {
        use reprise_crds::traffic::{EXHAUSTED_REASONS, SKIP_REASONS};
        let exhausted = [
            ExhaustedBy::Attempts,
            ExhaustedBy::Budget,
            ExhaustedBy::Deadline,
            ExhaustedBy::NoAlternate,
            ExhaustedBy::RetryAfterTooLong,
        ]
        .map(|by| {
            // A new reason does not compile here until it is in the list above.
            match by {
                ExhaustedBy::Attempts
                | ExhaustedBy::Budget
                | ExhaustedBy::Deadline
                | ExhaustedBy::NoAlternate
                | ExhaustedBy::RetryAfterTooLong => {}
            }
            Outcome::Exhausted(by).reason()
        });
        assert_eq!(exhausted, EXHAUSTED_REASONS);
        let skipped = [
            SkipReason::RetriesOff,
            SkipReason::Method,
            SkipReason::Tunnel,
            SkipReason::Upgrade,
            SkipReason::BodyConsumed,
            SkipReason::FailureBoundary,
            SkipReason::TransportOff,
            SkipReason::NotRetryable,
            SkipReason::Pushback,
            SkipReason::UpperLayerRetry,
        ]
        .map(|why| {
            match why {
                SkipReason::RetriesOff
                | SkipReason::Method
                | SkipReason::Tunnel
                | SkipReason::Upgrade
                | SkipReason::BodyConsumed
                | SkipReason::FailureBoundary
                | SkipReason::TransportOff
                | SkipReason::NotRetryable
                | SkipReason::Pushback
                | SkipReason::UpperLayerRetry => {}
            }
            Outcome::Skipped(why).reason()
        });
        assert_eq!(skipped, SKIP_REASONS);
    }
}
