//! TLS to target Services from Gateway API's BackendTLSPolicy: which policy
//! applies to a target's port, the TLS it gives or why it cannot be used
//! (in the terms of its status), and the CA bundles of the ConfigMaps the
//! policies reference, read by name and kept fresh.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, ResourceExt};
use reprise_crds::resource::RetryPolicy;
use reprise_crds::snapshot::{SnapshotTls, SnapshotUpstream};

use super::{watch, Cache, Watched};
use crate::policy::backend_tls::{self, BackendTLSPolicy, CA_KEY};
use crate::policy::target::{self, TargetProblem};

/// How often the referenced CA ConfigMaps are read again (a rotated CA
/// reaches the sidecars within this).
pub(crate) const CA_REFRESH: Duration = Duration::from_secs(60);

/// How often the set of referenced ConfigMaps is compared with the one read.
const CA_REFS_CHECK: Duration = Duration::from_secs(2);

/// The CA bundles of the ConfigMaps BackendTLSPolicies reference, by
/// namespace and name: the PEM under `ca.crt`, or why there is none.
pub(super) type CaBundles = HashMap<(String, String), Result<String, String>>;

/// Why a BackendTLSPolicy cannot be used, in the terms of its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsProblem {
    /// Which condition says it, and with which reason.
    pub(crate) kind: TlsProblemKind,
    /// For people, naming the policy.
    pub(crate) message: String,
}

/// The specification's reasons for a BackendTLSPolicy that cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TlsProblemKind {
    /// A CA reference of a kind other than ConfigMap: `ResolvedRefs=False`,
    /// `InvalidKind`.
    InvalidKind,
    /// A CA ConfigMap missing, without `ca.crt`, or not a bundle:
    /// `ResolvedRefs=False`, `InvalidCACertificateRef`, and `Accepted=False`,
    /// `NoValidCACertificate`.
    InvalidCaCertificateRef,
    /// Something Reprise does not support or the spec forbids:
    /// `Accepted=False`, `Invalid`.
    Invalid,
}

impl Cache {
    /// Adds to `upstream` (Service `service` in `namespace`) the TLS of the
    /// BackendTLSPolicy that applies to its port, if any; a policy that
    /// applies but cannot be used leaves the target unresolved, never
    /// pushed without its TLS.
    pub(super) fn with_tls(
        &self,
        upstream: &mut SnapshotUpstream,
        namespace: &str,
        service: &str,
        port_name: Option<&str>,
    ) -> Result<(), TargetProblem> {
        let tls = match self.backend_tls_of(namespace, service, port_name) {
            None => return Ok(()),
            Some((_, Err(problem))) => return Err(TargetProblem::Tls(problem.message)),
            Some((_, Ok(tls))) => tls,
        };
        upstream.tls = Some(tls);
        // TLS with ALPN: the endpoint picks HTTP/2 or HTTP/1.1, unless the
        // port says HTTP/2 (kubernetes.io/h2c), which over TLS is h2.
        upstream.protocol = match upstream.protocol {
            reprise_crds::Protocol::H2c => reprise_crds::Protocol::H2,
            _ => reprise_crds::Protocol::Auto,
        };
        Ok(())
    }

    /// The BackendTLSPolicy that applies to `policy`'s target, if any, with
    /// the TLS it gives or why it cannot be used.
    pub(crate) fn backend_tls_for(
        &self,
        policy: &RetryPolicy,
    ) -> Option<(Arc<BackendTLSPolicy>, Result<SnapshotTls, TlsProblem>)> {
        let own = policy.namespace().unwrap_or_default();
        let namespace = policy.spec.target_namespace(&own);
        let name = &policy.spec.target_ref.name;
        let service = self
            .services
            .store
            .get(&ObjectRef::new(name).within(namespace));
        let port_name = target::port_name(service.as_deref(), policy.spec.target_ref.port);
        self.backend_tls_of(namespace, name, port_name.as_deref())
    }

    /// The BackendTLSPolicy that applies to the port `port_name` of
    /// Service `service` in `namespace`, if any, with the TLS it gives or
    /// why it cannot be used.
    pub(crate) fn backend_tls_of(
        &self,
        namespace: &str,
        service: &str,
        port_name: Option<&str>,
    ) -> Option<(Arc<BackendTLSPolicy>, Result<SnapshotTls, TlsProblem>)> {
        let candidates = self
            .backend_tls
            .store
            .state_filter(|p| p.namespace().as_deref() == Some(namespace));
        let applying = backend_tls::applying(candidates.iter().map(|p| &**p), service, port_name)?;
        let applying = candidates
            .iter()
            .find(|p| std::ptr::eq(&***p, applying))
            .map(Arc::clone)?;
        let verdict = self.tls_given(&applying, namespace);
        Some((applying, verdict))
    }

    /// The TLS `policy` gives, with the CA bundles read so far.
    fn tls_given(
        &self,
        policy: &BackendTLSPolicy,
        namespace: &str,
    ) -> Result<SnapshotTls, TlsProblem> {
        let wanted = backend_tls::wanted(policy).map_err(|u| TlsProblem {
            kind: match u {
                backend_tls::Unusable::InvalidKind(_) => TlsProblemKind::InvalidKind,
                backend_tls::Unusable::Invalid(_) => TlsProblemKind::Invalid,
            },
            message: u.message().to_string(),
        })?;
        let ca_ref = |message: String| TlsProblem {
            kind: TlsProblemKind::InvalidCaCertificateRef,
            message,
        };
        let ca_certificates = if wanted.ca_config_maps.is_empty() {
            None
        } else {
            let bundles = self.ca_bundles.read().unwrap_or_else(|e| e.into_inner());
            let mut pem = String::new();
            for name in &wanted.ca_config_maps {
                match bundles.get(&(namespace.to_string(), name.clone())) {
                    Some(Ok(one)) => {
                        pem.push_str(one);
                        pem.push('\n');
                    }
                    Some(Err(why)) => return Err(ca_ref(format!("{}: {why}", wanted.policy))),
                    None => {
                        return Err(ca_ref(format!(
                            "{}: ConfigMap {namespace}/{name} not read yet",
                            wanted.policy
                        )))
                    }
                }
            }
            // Checked here as every sidecar will check it, so a bad bundle
            // shows in the RetryPolicy's status rather than in NACKs.
            reprise_crds::tls::parse_bundle(pem.as_bytes(), CA_KEY)
                .map_err(|rule| ca_ref(format!("{}: caCertificateRefs {rule}", wanted.policy)))?;
            Some(pem)
        };
        Ok(SnapshotTls {
            server_name: wanted.hostname,
            ca_certificates,
            subject_alt_names: wanted.subject_alt_names,
        })
    }
}

/// Keeps the CA bundles of the ConfigMaps BackendTLSPolicies reference: read
/// when the set referenced changes and every [`CA_REFRESH`]; a read that
/// fails keeps what was read before. A change bumps the push streams and
/// reconciles every policy again.
pub(super) async fn keep_ca_bundles(
    client: Client,
    policies: Watched<BackendTLSPolicy>,
    bundles: Arc<RwLock<CaBundles>>,
    read: Arc<std::sync::atomic::AtomicBool>,
    signals: watch::Signals,
) {
    if !policies.ready_or_missing().await {
        return;
    }
    let mut read_at: Option<(BTreeSet<(String, String)>, tokio::time::Instant)> = None;
    loop {
        let wanted: BTreeSet<(String, String)> = policies
            .store
            .state()
            .iter()
            .flat_map(|p| {
                let ns = p.namespace().unwrap_or_default();
                p.spec
                    .validation
                    .ca_certificate_refs
                    .iter()
                    .filter(|r| r.group.is_empty() && r.kind == "ConfigMap")
                    .map(move |r| (ns.clone(), r.name.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let due = read_at
            .as_ref()
            .is_none_or(|(set, at)| *set != wanted || at.elapsed() >= CA_REFRESH);
        if due {
            let previous = bundles.read().unwrap_or_else(|e| e.into_inner()).clone();
            let mut fresh = CaBundles::new();
            for (ns, name) in &wanted {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
                let key = (ns.clone(), name.clone());
                let got = match api.get_opt(name).await {
                    Ok(Some(cm)) => cm
                        .data
                        .and_then(|mut d| d.remove(CA_KEY))
                        .ok_or_else(|| format!("ConfigMap {ns}/{name} has no key {CA_KEY}")),
                    Ok(None) => Err(format!("ConfigMap {ns}/{name} not found")),
                    Err(e) => match previous.get(&key) {
                        Some(kept) => kept.clone(),
                        None => Err(format!("ConfigMap {ns}/{name} cannot be read: {e}")),
                    },
                };
                fresh.insert(key, got);
            }
            if fresh != previous {
                *bundles.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                signals.touch(super::dirty::Touch::All);
                signals.bump();
                signals.relisted.send(());
            }
            read_at = Some((wanted, tokio::time::Instant::now()));
            read.store(true, std::sync::atomic::Ordering::Release);
        }
        tokio::time::sleep(CA_REFS_CHECK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, service, slice};
    use reprise_crds::Protocol;

    fn backend_tls(section: Option<&str>, validation: serde_json::Value) -> BackendTLSPolicy {
        let mut target = serde_json::json!({ "group": "", "kind": "Service", "name": "api" });
        if let Some(s) = section {
            target["sectionName"] = serde_json::json!(s);
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "BackendTLSPolicy",
            "metadata": { "name": "api-tls", "namespace": "shop", "creationTimestamp": "2026-12-01T00:00:00Z" },
            "spec": { "targetRefs": [target], "validation": validation }
        }))
        .expect("policy")
    }

    /// `api` in `shop` with ports `http` 80 and `grpc` 9090 (h2c), and one
    /// ready pod.
    fn api_cache() -> Cache {
        Cache::fixed(
            [],
            [service(serde_json::json!([
                { "name": "http", "port": 80 },
                { "name": "grpc", "port": 9090, "appProtocol": "kubernetes.io/h2c" }
            ]))],
            [slice(
                "api-1",
                serde_json::json!([{ "addresses": ["10.0.0.1"], "conditions": { "ready": true } }]),
            )],
        )
    }

    fn target(cache: &Cache, port: i32) -> Result<SnapshotUpstream, TargetProblem> {
        let mut p = fixtures::policy().build();
        p.spec.target_ref.port = Some(port);
        cache.target(&p)
    }

    #[test]
    fn a_backend_tls_policy_gives_the_target_tls_with_its_ca_and_alpn() {
        let ca = crate::tls::generate(&["api.test".to_string()])
            .expect("a CA")
            .ca_pem;
        let with_ca = serde_json::json!({ "hostname": "api.test", "caCertificateRefs": [{ "group": "", "kind": "ConfigMap", "name": "api-ca" }] });
        let cache = api_cache().with_backend_tls(
            [backend_tls(None, with_ca.clone())],
            [("shop".into(), "api-ca".into(), ca.clone())],
        );
        let http = target(&cache, 80).expect("resolved");
        let tls = http.tls.expect("tls");
        assert_eq!(tls.server_name, "api.test");
        assert!(tls.ca_certificates.is_some_and(|pem| pem.starts_with(&ca)));
        assert_eq!(http.protocol, Protocol::Auto, "ALPN: the pod picks");
        assert_eq!(
            target(&cache, 9090).map(|u| u.protocol),
            Ok(Protocol::H2),
            "h2c over TLS is h2"
        );

        // A policy for another port leaves this one in plain text.
        let cache = api_cache().with_backend_tls(
            [backend_tls(Some("grpc"), with_ca.clone())],
            [("shop".into(), "api-ca".into(), ca)],
        );
        assert_eq!(target(&cache, 80).map(|u| u.tls), Ok(None));
        assert!(target(&cache, 9090).is_ok_and(|u| u.tls.is_some()));

        // The public roots.
        let system =
            serde_json::json!({ "hostname": "api.test", "wellKnownCACertificates": "System" });
        let cache = api_cache().with_backend_tls([backend_tls(None, system)], []);
        assert!(
            target(&cache, 80).is_ok_and(|u| u.tls.is_some_and(|t| t.ca_certificates.is_none()))
        );
    }

    #[test]
    fn a_backend_tls_policy_that_cannot_be_used_leaves_the_target_unresolved() {
        let with_ca = serde_json::json!({ "hostname": "api.test", "caCertificateRefs": [{ "group": "", "kind": "ConfigMap", "name": "api-ca" }] });
        let unread = api_cache().with_backend_tls([backend_tls(None, with_ca.clone())], []);
        assert_eq!(
            target(&unread, 80),
            Err(TargetProblem::Tls(
                "BackendTLSPolicy shop/api-tls: ConfigMap shop/api-ca not read yet".into()
            ))
        );
        let garbage = api_cache().with_backend_tls(
            [backend_tls(None, with_ca)],
            [("shop".into(), "api-ca".into(), "not a certificate".into())],
        );
        assert!(
            matches!(target(&garbage, 80), Err(TargetProblem::Tls(m)) if m.contains("caCertificateRefs must hold at least one PEM certificate")),
            "{:?}",
            target(&garbage, 80)
        );
        let san = serde_json::json!({ "hostname": "api.test", "wellKnownCACertificates": "System", "subjectAltNames": [{ "type": "URI", "uri": "spiffe://cluster/ns/shop/sa/api" }] });
        let unsupported = api_cache().with_backend_tls([backend_tls(None, san)], []);
        assert!(
            matches!(target(&unsupported, 80), Err(TargetProblem::Tls(m)) if m.contains("URI names are not supported"))
        );
    }
}
