//! What a policy, or a whole sidecar, says of deadlines that travel between
//! hops (`docs/src/tasks/deadlines.md`): whether attempts carry the
//! request's deadline to the next hop, and whether a deadline that came
//! with the request caps its attempts. Two switches, because trusting
//! callers and telling callees are separate decisions.

use serde::{Deserialize, Serialize};

/// Deadline propagation, both ways on by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeadlinePolicy {
    /// Each attempt carries the request's deadline (the earliest of the
    /// caller's, the policy's and the attempt's own timeout) in `baggage`
    /// and, for gRPC, `grpc-timeout`. Never towards DNS-named upstreams.
    pub propagate: bool,
    /// A deadline that came with the request (in the `baggage` the
    /// application forwarded) caps the total deadline and each attempt's
    /// timeout. It can only ever shorten the caller's own request.
    pub accept_incoming: bool,
}

impl DeadlinePolicy {
    /// Both ways on: the default.
    pub const ON: DeadlinePolicy = DeadlinePolicy {
        propagate: true,
        accept_incoming: true,
    };

    /// What both `self` and `other` allow (a sidecar's setting and a
    /// policy's: either may turn a way off).
    pub fn and(self, other: DeadlinePolicy) -> DeadlinePolicy {
        DeadlinePolicy {
            propagate: self.propagate && other.propagate,
            accept_incoming: self.accept_incoming && other.accept_incoming,
        }
    }
}

impl Default for DeadlinePolicy {
    fn default() -> Self {
        Self::ON
    }
}

/// Which layers of a call chain retry one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryLayers {
    /// Every layer retries what fails, under its own policy (the default).
    #[default]
    Every,
    /// A request that is already an upper layer's retry or hedge (it
    /// carries `reprise-retry` in `baggage`) is not retried here, and this
    /// policy's retries and hedges carry the mark so the layers below do
    /// the same.
    Once,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_side_turns_a_way_off_and_on_is_the_default() {
        assert_eq!(DeadlinePolicy::default(), DeadlinePolicy::ON);
        let no_send = DeadlinePolicy {
            propagate: false,
            ..DeadlinePolicy::ON
        };
        let no_accept = DeadlinePolicy {
            accept_incoming: false,
            ..DeadlinePolicy::ON
        };
        assert_eq!(DeadlinePolicy::ON.and(no_send), no_send);
        assert_eq!(no_accept.and(DeadlinePolicy::ON), no_accept);
        assert_eq!(
            no_send.and(no_accept),
            DeadlinePolicy {
                propagate: false,
                accept_incoming: false
            }
        );
    }
}
