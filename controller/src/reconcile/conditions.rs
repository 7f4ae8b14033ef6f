//! The conditions on a RetryPolicy's status: their types and reasons (the guide:
//! `docs/src/reference/errors.md`), always looked up by type.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use reprise_crds::resource::RetryPolicyStatus;

/// A condition's type, in the order conditions are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConditionType {
    /// The policy is valid and its target resolved.
    Accepted,
    /// The selected sidecars run the policy's current generation.
    InSync,
}

/// Why a condition has its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// `Accepted=True`: valid, and the target resolved.
    Valid,
    /// `Accepted=False`: the shared validation refused the spec.
    InvalidSpec,
    /// `Accepted=False`: no such Service in the policy's namespace.
    TargetNotFound,
    /// `Accepted=False`: the Service has no such port (or several, none chosen).
    PortNotFound,
    /// `Accepted=False`: a BackendTLSPolicy applies to the target's port but
    /// cannot be used (an invalid or missing CA ConfigMap, a field not
    /// supported): nothing is pushed without its TLS.
    BackendTLSNotResolved,
    /// `InSync=True`: every selected sidecar ACKed this generation.
    AllSidecarsInSync,
    /// `InSync=False`: some selected sidecars have not ACKed it yet.
    Pending,
    /// `InSync=False`: some selected sidecars are too old for the target
    /// (TLS, DNS-named endpoints) and are not sent the policy.
    SidecarsOutdated,
    /// `InSync=True`: no connected sidecar is selected.
    NoSidecars,
    /// `InSync=False`: a policy that is not accepted is not pushed.
    NotAccepted,
}

impl ConditionType {
    /// The `type` written.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            ConditionType::Accepted => "Accepted",
            ConditionType::InSync => "InSync",
        }
    }
}

impl Reason {
    /// The `reason` written.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Reason::Valid => "Valid",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::TargetNotFound => "TargetNotFound",
            Reason::PortNotFound => "PortNotFound",
            Reason::BackendTLSNotResolved => "BackendTLSNotResolved",
            Reason::AllSidecarsInSync => "AllSidecarsInSync",
            Reason::Pending => "Pending",
            Reason::SidecarsOutdated => "SidecarsOutdated",
            Reason::NoSidecars => "NoSidecars",
            Reason::NotAccepted => "NotAccepted",
        }
    }
}

/// What one condition says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// `status: "True"` when set.
    pub(crate) ok: bool,
    /// Why.
    pub(crate) reason: Reason,
    /// For people.
    pub(crate) message: String,
}

/// The condition of type `type_` in `status`.
pub(crate) fn find(status: Option<&RetryPolicyStatus>, type_: ConditionType) -> Option<&Condition> {
    status?
        .conditions
        .iter()
        .find(|c| c.type_ == type_.as_str())
}

/// Whether `status` has the condition `type_` with `reason`.
pub(crate) fn has_reason(
    status: Option<&RetryPolicyStatus>,
    type_: ConditionType,
    reason: Reason,
) -> bool {
    find(status, type_).is_some_and(|c| c.reason == reason.as_str())
}

/// The condition `type_` saying `verdict`. It keeps the transition time of
/// the same condition in `previous` while its status and reason stay the
/// same, so an unchanged policy gets an unchanged status.
pub(crate) fn condition(
    previous: Option<&RetryPolicyStatus>,
    type_: ConditionType,
    verdict: Verdict,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if verdict.ok { "True" } else { "False" };
    let since = find(previous, type_)
        .filter(|c| c.status == status && c.reason == verdict.reason.as_str())
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.as_str().to_string(),
        status: status.to_string(),
        reason: verdict.reason.as_str().to_string(),
        message: verdict.message,
        observed_generation: generation,
        last_transition_time: since,
    }
}
