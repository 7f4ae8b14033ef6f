//! The status Reprise writes on a BackendTLSPolicy it uses (one that applies
//! to a RetryPolicy's target): an entry of `status.ancestors` per target
//! Service, `ancestorRef` the Service and `controllerName`
//! [`CONTROLLER_NAME`], with the conditions the specification defines:
//! `Accepted` (`Accepted`; `Invalid`, `NoValidCACertificate`) and
//! `ResolvedRefs` (`ResolvedRefs`; `InvalidCACertificateRef`, `InvalidKind`).
//! Gateway API's ancestors are gateways; for a mesh's use the Service is the
//! ancestor, so each Service the policy serves reports once.
//!
//! The list is atomic and shared with other controllers (a gateway may use
//! the same policy): it is read from the cache, Reprise's own entry replaced,
//! and written back with the `resourceVersion` read, so another
//! controller's concurrent write makes this one fail (409) and the next
//! reconcile tries again, never erasing theirs. Nothing is written when the
//! entry says what it already said.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use reprise_crds::resource::RetryPolicy;
use serde_json::{json, Value};

use super::Context;
use crate::cache::{TlsProblem, TlsProblemKind};
use crate::policy::backend_tls::BackendTLSPolicy;
use crate::Error;

/// The `controllerName` of Reprise's entries.
pub(crate) const CONTROLLER_NAME: &str = "reprise.dev/controller";

/// Writes the status entry of the BackendTLSPolicy that applies to
/// `policy`'s target, when one does and the entry changed.
pub(crate) async fn report(ctx: &Context, policy: &RetryPolicy, now: &Time) -> Result<(), Error> {
    let Some((tls, verdict)) = ctx.cache.backend_tls_for(policy) else {
        return Ok(());
    };
    let namespace = tls.namespace().unwrap_or_default();
    let service = &policy.spec.target_ref.name;
    let current = tls
        .status
        .as_ref()
        .map(|s| s.ancestors.clone())
        .unwrap_or_default();
    let Some(ancestors) = updated(
        &current,
        &namespace,
        service,
        tls.metadata.generation,
        verdict.as_ref().err(),
        now,
    ) else {
        return Ok(());
    };
    let api: Api<BackendTLSPolicy> = Api::namespaced(ctx.client.clone(), &namespace);
    let patch = json!({
        "metadata": { "resourceVersion": tls.resource_version() },
        "status": { "ancestors": ancestors },
    });
    api.patch_status(
        &tls.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(Error::Kube)?;
    Ok(())
}

/// `ancestors` with Reprise's entry for `service` saying `problem` (none:
/// accepted and resolved), or `None` when it already says that. Conditions
/// keep their transition time while their status and reason stay.
fn updated(
    ancestors: &[Value],
    namespace: &str,
    service: &str,
    generation: Option<i64>,
    problem: Option<&TlsProblem>,
    now: &Time,
) -> Option<Vec<Value>> {
    let ours = |a: &Value| {
        a["controllerName"] == CONTROLLER_NAME
            && a["ancestorRef"]["kind"] == "Service"
            && a["ancestorRef"]["name"] == service
    };
    let previous = ancestors.iter().find(|a| ours(a));
    let (accepted, resolved) = verdicts(problem);
    let condition = |kind: &str, (ok, reason, message): (bool, &str, String)| {
        let status = if ok { "True" } else { "False" };
        let since = previous
            .and_then(|p| p["conditions"].as_array())
            .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
            .filter(|c| c["status"] == status && c["reason"] == reason)
            .and_then(|c| serde_json::from_value::<Time>(c["lastTransitionTime"].clone()).ok())
            .unwrap_or_else(|| now.clone());
        Condition {
            type_: kind.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time: since,
        }
    };
    let entry = json!({
        "ancestorRef": { "group": "", "kind": "Service", "name": service, "namespace": namespace },
        "controllerName": CONTROLLER_NAME,
        "conditions": [condition("Accepted", accepted), condition("ResolvedRefs", resolved)],
    });
    if previous == Some(&entry) {
        return None;
    }
    let mut out: Vec<Value> = ancestors.iter().filter(|a| !ours(a)).cloned().collect();
    out.push(entry);
    Some(out)
}

/// `Accepted` and `ResolvedRefs` as (true?, reason, message).
fn verdicts(
    problem: Option<&TlsProblem>,
) -> ((bool, &'static str, String), (bool, &'static str, String)) {
    let resolved = || (true, "ResolvedRefs", "every reference resolved".to_string());
    match problem {
        None => (
            (
                true,
                "Accepted",
                "used by Reprise's sidecars for their connections to the Service".to_string(),
            ),
            resolved(),
        ),
        Some(p) => match p.kind {
            TlsProblemKind::InvalidKind => (
                (false, "NoValidCACertificate", p.message.clone()),
                (false, "InvalidKind", p.message.clone()),
            ),
            TlsProblemKind::InvalidCaCertificateRef => (
                (false, "NoValidCACertificate", p.message.clone()),
                (false, "InvalidCACertificateRef", p.message.clone()),
            ),
            TlsProblemKind::Invalid => ((false, "Invalid", p.message.clone()), resolved()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("time"))
    }

    #[test]
    fn reprise_replaces_only_its_own_entry_and_keeps_transition_times() {
        let gateway = json!({
            "ancestorRef": { "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw" },
            "controllerName": "example.com/gateway",
            "conditions": []
        });
        let first = updated(
            std::slice::from_ref(&gateway),
            "shop",
            "api",
            Some(2),
            None,
            &at(100),
        )
        .expect("added");
        assert_eq!(first.len(), 2);
        assert_eq!(
            first[0], gateway,
            "another controller's entry is kept as it was"
        );
        assert_eq!(first[1]["conditions"][0]["reason"], "Accepted");
        assert_eq!(first[1]["conditions"][1]["reason"], "ResolvedRefs");
        assert_eq!(first[1]["ancestorRef"]["name"], "api");
        // The same verdict later: nothing to write.
        assert_eq!(
            updated(&first, "shop", "api", Some(2), None, &at(200)),
            None
        );
        // A missing ConfigMap: both conditions turn, at the new time.
        let missing = TlsProblem {
            kind: TlsProblemKind::InvalidCaCertificateRef,
            message: "ConfigMap shop/api-ca not found".into(),
        };
        let second =
            updated(&first, "shop", "api", Some(3), Some(&missing), &at(300)).expect("changed");
        assert_eq!(second.len(), 2);
        let ours = &second[1]["conditions"];
        assert_eq!(ours[0]["status"], "False");
        assert_eq!(ours[0]["reason"], "NoValidCACertificate");
        assert_eq!(ours[1]["reason"], "InvalidCACertificateRef");
        assert_eq!(ours[1]["observedGeneration"], 3);
        assert_eq!(
            ours[1]["lastTransitionTime"],
            serde_json::to_value(at(300)).expect("time")
        );
        // Unsupported fields: not accepted, references still resolved (kept since 100).
        let invalid = TlsProblem {
            kind: TlsProblemKind::Invalid,
            message: "subjectAltNames".into(),
        };
        let third =
            updated(&first, "shop", "api", Some(2), Some(&invalid), &at(400)).expect("changed");
        assert_eq!(third[1]["conditions"][0]["reason"], "Invalid");
        assert_eq!(
            third[1]["conditions"][1]["lastTransitionTime"],
            serde_json::to_value(at(100)).expect("time")
        );
    }
}
