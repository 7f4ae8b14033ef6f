//! Gateway API's `BackendTLSPolicy` (`gateway.networking.k8s.io/v1`, standard
//! channel since v1.4) as Reprise reads it: TLS from the sidecars to a
//! Service's pods (or to an `ExternalName` Service's external name).
//!
//! Gateway API scopes the policy to gateways and lets implementations use it
//! for other connections to a Service ("Implementation-Specific: service
//! mesh workload-to-service communication"); Reprise does, for every sidecar
//! that calls the Service. What is read:
//! - `targetRefs` naming a core `Service` in the policy's namespace, all its
//!   ports or the one `sectionName` names; of several policies for one port
//!   the oldest wins, then the first by `namespace/name` (the spec's rule);
//! - `validation.hostname`: SNI and the name verified;
//! - `validation.caCertificateRefs`: ConfigMaps in the namespace, key `ca.crt`
//!   (read one by one, never every ConfigMap in the cluster), or
//!   `validation.wellKnownCACertificates: System`: the sidecar's compiled-in
//!   public roots.
//!
//! - `validation.subjectAltNames` of type `Hostname`: the certificate must
//!   carry one of them instead of the hostname (still sent as SNI). `URI`
//!   names (SPIFFE IDs) are not supported: a policy listing one does not
//!   resolve, so the RetryPolicy says so and nothing is pushed
//!   half-configured.
//!
//! The policy has no client certificates (v1 has none); those stay a
//! file-format feature.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// `BackendTLSPolicy` as far as Reprise reads it (unknown fields ignored).
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "BackendTLSPolicy",
    plural = "backendtlspolicies",
    namespaced,
    status = "BackendTlsPolicyStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct BackendTlsPolicySpec {
    /// What the policy applies to.
    #[serde(default)]
    pub target_refs: Vec<TargetRef>,
    /// How the backend's certificate is verified.
    #[serde(default)]
    pub validation: Validation,
    /// Implementation-specific options (none read).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// A `LocalPolicyTargetReferenceWithSectionName`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// API group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Kind (`Service`).
    #[serde(default)]
    pub kind: String,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// A port's name; none: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// `spec.validation`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Validation {
    /// ConfigMaps (key `ca.crt`) holding the CA bundle.
    #[serde(default, rename = "caCertificateRefs")]
    pub ca_certificate_refs: Vec<ObjectRef>,
    /// `System`: the well-known public roots.
    #[serde(
        default,
        rename = "wellKnownCACertificates",
        skip_serializing_if = "Option::is_none"
    )]
    pub well_known_ca_certificates: Option<String>,
    /// SNI and the name verified.
    #[serde(default)]
    pub hostname: String,
    /// Names the certificate must carry one of (not supported yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<serde_json::Value>,
}

/// A `LocalObjectReference`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// API group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Kind (`ConfigMap`).
    #[serde(default)]
    pub kind: String,
    /// Name.
    #[serde(default)]
    pub name: String,
}

/// `status` (a `PolicyStatus`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendTlsPolicyStatus {
    /// One entry per ancestor and controller.
    #[serde(default)]
    pub ancestors: Vec<serde_json::Value>,
    /// Unused; keeps the shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The key of a ConfigMap that holds a CA bundle (Gateway API's "Core" support).
pub(crate) const CA_KEY: &str = "ca.crt";

/// TLS as a policy asks for it, before its ConfigMaps are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// `namespace/name` of the policy.
    pub(crate) policy: String,
    /// SNI and the name verified.
    pub(crate) hostname: String,
    /// The ConfigMaps to read; empty: the public roots.
    pub(crate) ca_config_maps: Vec<String>,
    /// Names the certificate must carry one of instead of the hostname.
    pub(crate) subject_alt_names: Vec<String>,
}

/// Why a policy's TLS cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unusable {
    /// A reference to something other than a core ConfigMap (`InvalidKind`).
    InvalidKind(String),
    /// Nothing to verify with, or both kinds of trust, or an unknown
    /// well-known set, or subject alternative names (`Invalid`).
    Invalid(String),
}

impl Unusable {
    /// For people, naming the policy.
    pub(crate) fn message(&self) -> &str {
        match self {
            Unusable::InvalidKind(m) | Unusable::Invalid(m) => m,
        }
    }
}

/// The policy among `policies` (all in the Service's namespace) that
/// applies to port `port_name` of Service `service`: targeting the Service
/// with no section or with that port's name; the oldest, then the first by
/// name.
pub(crate) fn applying<'a>(
    policies: impl IntoIterator<Item = &'a BackendTLSPolicy>,
    service: &str,
    port_name: Option<&str>,
) -> Option<&'a BackendTLSPolicy> {
    policies
        .into_iter()
        .filter(|p| {
            p.spec.target_refs.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == "Service"
                    && t.name == service
                    && t.section_name
                        .as_deref()
                        .is_none_or(|s| Some(s) == port_name)
            })
        })
        .min_by(|a, b| {
            let created = |p: &BackendTLSPolicy| p.metadata.creation_timestamp.clone().map(|t| t.0);
            created(a)
                .cmp(&created(b))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        })
}

/// What `policy` asks for, or why it cannot be used.
pub(crate) fn wanted(policy: &BackendTLSPolicy) -> Result<Wanted, Unusable> {
    let id = format!(
        "BackendTLSPolicy {}/{}",
        policy.metadata.namespace.as_deref().unwrap_or_default(),
        policy.metadata.name.as_deref().unwrap_or_default()
    );
    let v = &policy.spec.validation;
    let mut subject_alt_names = Vec::with_capacity(v.subject_alt_names.len());
    for (i, san) in v.subject_alt_names.iter().enumerate() {
        match (san["type"].as_str(), san["hostname"].as_str()) {
            (Some("Hostname"), Some(name)) if !name.is_empty() => {
                subject_alt_names.push(name.to_ascii_lowercase());
            }
            (Some("URI"), _) => {
                return Err(Unusable::Invalid(format!(
                    "{id}: validation.subjectAltNames[{i}]: URI names are not supported (Hostname names are)"
                )))
            }
            _ => {
                return Err(Unusable::Invalid(format!(
                    "{id}: validation.subjectAltNames[{i}]: must be a Hostname name with its hostname"
                )))
            }
        }
    }
    if v.hostname.is_empty() {
        return Err(Unusable::Invalid(format!(
            "{id}: validation.hostname must be set"
        )));
    }
    if let Some(bad) = v
        .ca_certificate_refs
        .iter()
        .find(|r| !r.group.is_empty() || r.kind != "ConfigMap")
    {
        return Err(Unusable::InvalidKind(format!(
            "{id}: validation.caCertificateRefs: {}/{} {} is not a ConfigMap (the only kind supported)",
            if bad.group.is_empty() { "core" } else { &bad.group },
            bad.kind,
            bad.name
        )));
    }
    match (
        v.ca_certificate_refs.is_empty(),
        v.well_known_ca_certificates.as_deref(),
    ) {
        (true, Some("System")) | (false, None) => {}
        (true, Some(other)) => {
            return Err(Unusable::Invalid(format!(
                "{id}: validation.wellKnownCACertificates: {other} is not supported (System is)"
            )))
        }
        (true, None) => {
            return Err(Unusable::Invalid(format!(
                "{id}: validation needs caCertificateRefs or wellKnownCACertificates"
            )))
        }
        (false, Some(_)) => {
            return Err(Unusable::Invalid(format!(
                "{id}: validation.caCertificateRefs and wellKnownCACertificates are exclusive"
            )))
        }
    }
    Ok(Wanted {
        policy: id,
        hostname: v.hostname.clone(),
        ca_config_maps: v
            .ca_certificate_refs
            .iter()
            .map(|r| r.name.clone())
            .collect(),
        subject_alt_names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, created: i64, spec: serde_json::Value) -> BackendTLSPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "BackendTLSPolicy",
            "metadata": {
                "name": name,
                "namespace": "shop",
                "creationTimestamp": format!("2026-12-0{created}T00:00:00Z")
            },
            "spec": spec
        }))
        .expect("policy")
    }

    fn to(
        service: &str,
        section: Option<&str>,
        validation: serde_json::Value,
    ) -> serde_json::Value {
        let mut target = serde_json::json!({ "group": "", "kind": "Service", "name": service });
        if let Some(s) = section {
            target["sectionName"] = serde_json::json!(s);
        }
        serde_json::json!({ "targetRefs": [target], "validation": validation })
    }

    #[test]
    fn the_oldest_policy_for_the_port_applies_then_the_first_by_name() {
        let ca = serde_json::json!({ "hostname": "api.test", "wellKnownCACertificates": "System" });
        let policies = [
            policy("b-whole", 2, to("api", None, ca.clone())),
            policy("a-whole", 2, to("api", None, ca.clone())),
            policy("c-https", 1, to("api", Some("https"), ca.clone())),
            policy("d-other", 1, to("web", None, ca.clone())),
        ];
        let name = |p: Option<&BackendTLSPolicy>| p.and_then(|p| p.metadata.name.clone());
        assert_eq!(
            name(applying(&policies, "api", Some("https"))).as_deref(),
            Some("c-https")
        );
        assert_eq!(
            name(applying(&policies, "api", Some("http"))).as_deref(),
            Some("a-whole")
        );
        assert_eq!(
            name(applying(&policies, "api", None)).as_deref(),
            Some("a-whole")
        );
        assert_eq!(name(applying(&policies, "db", None)), None);
    }

    #[test]
    fn what_a_policy_asks_for_or_why_it_cannot_be_used() {
        let ok = policy(
            "p",
            1,
            to(
                "api",
                None,
                serde_json::json!({ "hostname": "api.test", "caCertificateRefs": [{ "group": "", "kind": "ConfigMap", "name": "api-ca" }] }),
            ),
        );
        assert_eq!(
            wanted(&ok),
            Ok(Wanted {
                policy: "BackendTLSPolicy shop/p".into(),
                hostname: "api.test".into(),
                ca_config_maps: vec!["api-ca".into()],
                subject_alt_names: vec![],
            })
        );
        let system = policy(
            "p",
            1,
            to(
                "api",
                None,
                serde_json::json!({ "hostname": "api.test", "wellKnownCACertificates": "System" }),
            ),
        );
        assert_eq!(wanted(&system).map(|w| w.ca_config_maps), Ok(vec![]));
        let sans = policy(
            "p",
            1,
            to(
                "api",
                None,
                serde_json::json!({ "hostname": "api.test", "wellKnownCACertificates": "System", "subjectAltNames": [{ "type": "Hostname", "hostname": "API.internal" }, { "type": "Hostname", "hostname": "api.other" }] }),
            ),
        );
        assert_eq!(
            wanted(&sans).map(|w| w.subject_alt_names),
            Ok(vec!["api.internal".to_string(), "api.other".to_string()])
        );
        for (validation, want) in [
            (serde_json::json!({ "hostname": "api.test", "caCertificateRefs": [{ "group": "", "kind": "Secret", "name": "s" }] }), Unusable::InvalidKind("BackendTLSPolicy shop/p: validation.caCertificateRefs: core/Secret s is not a ConfigMap (the only kind supported)".into())),
            (serde_json::json!({ "hostname": "api.test" }), Unusable::Invalid("BackendTLSPolicy shop/p: validation needs caCertificateRefs or wellKnownCACertificates".into())),
            (serde_json::json!({ "hostname": "api.test", "wellKnownCACertificates": "Corp" }), Unusable::Invalid("BackendTLSPolicy shop/p: validation.wellKnownCACertificates: Corp is not supported (System is)".into())),
            (serde_json::json!({ "hostname": "api.test", "wellKnownCACertificates": "System", "subjectAltNames": [{ "type": "URI", "uri": "spiffe://x" }] }), Unusable::Invalid("BackendTLSPolicy shop/p: validation.subjectAltNames[0]: URI names are not supported (Hostname names are)".into())),
            (serde_json::json!({ "hostname": "api.test", "wellKnownCACertificates": "System", "caCertificateRefs": [{ "group": "", "kind": "ConfigMap", "name": "c" }] }), Unusable::Invalid("BackendTLSPolicy shop/p: validation.caCertificateRefs and wellKnownCACertificates are exclusive".into())),
        ] {
            assert_eq!(wanted(&policy("p", 1, to("api", None, validation))), Err(want));
        }
    }
}
