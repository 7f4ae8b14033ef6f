//! What a RetryPolicy means in this cluster: whether it is valid (the shared
//! rules of `reprise-crds`, the same every sidecar runs), which upstream its
//! `targetRef` resolves to ([`target`]), and which pods it selects
//! ([`selection`]). Pure functions of API objects: the reconciler (status),
//! the push source (snapshots), the sidecar registry (sync counts) and
//! `explain` all ask them, so each question has one answer.

pub mod backend_tls;
pub(crate) mod budget;
pub(crate) mod route;
pub(crate) mod selection;
pub(crate) mod target;

use kube::ResourceExt;
use reprise_crds::resource::RetryPolicy;
use reprise_crds::validation::ValidationErrors;

/// `namespace/name`: how a policy is named in snapshots, ACK bookkeeping,
/// peer reports and logs.
pub(crate) fn id(policy: &RetryPolicy) -> String {
    format!(
        "{}/{}",
        policy.namespace().unwrap_or_default(),
        policy.name_any()
    )
}

/// Validates a policy with the shared rules (the same the sidecar runs),
/// and the CRD's rule on where a producer's callers may be, which the API
/// server enforces: a policy it did not see (an older CRD) is refused here.
pub(crate) fn validate(policy: &RetryPolicy) -> ValidationErrors {
    let mut errs = ValidationErrors::default();
    let own = policy.namespace().unwrap_or_default();
    if selection::is_producer(policy) && policy.spec.target_namespace(&own) != own {
        errs.push(
            "spec.callerNamespaces",
            "callerNamespaces other than Same needs a Service in this namespace (omit targetRef.namespace)",
        );
    }
    let _ = policy
        .spec
        .rule
        .resolve(&id(policy), "target", "spec", &mut errs);
    errs
}

/// The generation a policy's status and ACKs refer to (0 before the API
/// server assigned one).
pub(crate) fn generation(policy: &RetryPolicy) -> i64 {
    policy.metadata.generation.unwrap_or(0)
}
