//! The `deadlines` block of a RetryPolicy (`spec.deadlines`): deadline
//! propagation for the requests the policy matches, each way on unless set
//! to false. A sidecar's own setting (its namespace's or pod's
//! `reprise.dev/deadline-*` annotations) may have turned a way off already;
//! a policy can turn a way off, never back on.

use serde::{Deserialize, Serialize};

use crate::policy::{DeadlinePolicy, RetryLayers};

/// Which layers of a call chain retry one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(schemars::JsonSchema))]
pub enum Layers {
    /// Every layer retries what fails under its own policy (the default).
    #[default]
    Every,
    /// A request that is already an upper layer's retry or hedge (marked
    /// `reprise-retry` in `baggage`) is not retried here, and this policy's
    /// retries and hedges carry the mark so the layers below do the same.
    Once,
}

impl Layers {
    /// What the sidecar runs.
    pub(crate) fn resolve(self) -> RetryLayers {
        match self {
            Layers::Every => RetryLayers::Every,
            Layers::Once => RetryLayers::Once,
        }
    }
}

/// Deadlines across hops.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "resource", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Deadlines {
    /// Each attempt carries the request's deadline (the earliest of the
    /// caller's, this policy's totalDeadlineMs and the attempt's own
    /// attemptTimeoutMs) to the next hop: a `reprise-deadline` entry in W3C
    /// `baggage`, and `grpc-timeout` for gRPC. Never towards ExternalName
    /// Services. Default true.
    #[serde(default = "yes")]
    pub propagate: bool,
    /// A deadline that came with the request (in the `baggage` the
    /// application forwarded) caps the total deadline and each attempt's
    /// timeout; past it the sidecar answers 504 deadline_exceeded at once.
    /// It can only shorten the caller's own request. Default true.
    #[serde(default = "yes")]
    pub accept_incoming: bool,
}

fn yes() -> bool {
    true
}

impl Default for Deadlines {
    fn default() -> Self {
        Self {
            propagate: true,
            accept_incoming: true,
        }
    }
}

impl Deadlines {
    /// The switches the sidecar runs.
    pub(crate) fn resolve(&self) -> DeadlinePolicy {
        DeadlinePolicy {
            propagate: self.propagate,
            accept_incoming: self.accept_incoming,
        }
    }
}
