//! From a policy's target Service and its EndpointSlices to the upstream a
//! sidecar calls: the port clients use, the host names that reach it, and the
//! ready pod endpoints (`docs/src/concepts/retrypolicy.md`, "Targets");
//! for an `ExternalName` Service, the external name each sidecar resolves.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use reprise_crds::snapshot::{SnapshotDnsEndpoint, SnapshotEndpoint, SnapshotUpstream};
use reprise_crds::Protocol;

/// The label that ties an EndpointSlice to its Service.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Why a target could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TargetProblem {
    /// No such Service.
    NotFound,
    /// The Service has no port matching `targetRef.port` (or several and none chosen).
    Port(String),
    /// A BackendTLSPolicy applies to the port but cannot be used (why).
    Tls(String),
}

/// The name of the Service port `port` (the only port when `None`), which a
/// BackendTLSPolicy's `sectionName` names.
pub(crate) fn port_name(service: Option<&Service>, port: Option<i32>) -> Option<String> {
    let ports = service?.spec.as_ref()?.ports.as_ref()?;
    match port {
        Some(p) => ports.iter().find(|sp| sp.port == p)?.name.clone(),
        None if ports.len() == 1 => ports[0].name.clone(),
        None => None,
    }
}

/// The upstream name used for a Service in snapshots.
fn upstream_name(service: &str, namespace: &str) -> String {
    format!("{service}.{namespace}")
}

/// The host names clients in `client_namespace` may use for the Service.
fn hosts(service: &str, namespace: &str, client_namespace: &str) -> Vec<String> {
    let mut hosts = Vec::with_capacity(4);
    if namespace == client_namespace {
        hosts.push(service.to_string());
    }
    hosts.push(format!("{service}.{namespace}"));
    hosts.push(format!("{service}.{namespace}.svc"));
    hosts.push(format!("{service}.{namespace}.svc.cluster.local"));
    hosts
}

/// The Service's cluster IPs with the chosen port (`10.96.0.10:80`,
/// `[fd00::10]:80`): the destinations a transparently captured connection to
/// this Service carries. A headless Service (`None`) has none; its clients
/// dial pod IPs, which the sidecar matches by endpoint address instead.
fn virtual_addresses(service: &Service, port: i32) -> Vec<String> {
    let Some(spec) = service.spec.as_ref() else {
        return Vec::new();
    };
    let ips: Vec<&String> = match spec.cluster_ips.as_ref() {
        Some(ips) if !ips.is_empty() => ips.iter().collect(),
        _ => spec.cluster_ip.iter().collect(),
    };
    ips.into_iter()
        .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok())
        .map(|ip| std::net::SocketAddr::new(ip, u16::try_from(port).unwrap_or(0)).to_string())
        .collect()
}

/// The external name of a Service of type `ExternalName`.
fn external_name(service: &Service) -> Option<&str> {
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() != Some("ExternalName") {
        return None;
    }
    spec.external_name.as_deref().filter(|n| !n.is_empty())
}

/// An `ExternalName` Service: its external name is a DNS-named endpoint
/// each sidecar resolves (on the port clients call: such a Service has no
/// target port), and the `Host` every attempt carries, as Envoy's auto host
/// rewrite gives a DNS cluster, so `http://payments/` reaches the API with
/// the name it answers to. It has no cluster IP and no EndpointSlices.
fn resolve_external(
    service: &Service,
    external: &str,
    port: Option<i32>,
    client_namespace: &str,
) -> Result<SnapshotUpstream, TargetProblem> {
    let name = service.metadata.name.clone().unwrap_or_default();
    let namespace = service.metadata.namespace.clone().unwrap_or_default();
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    // A port the Service lists, or any port when it lists none (the
    // Service API does not require ports for an ExternalName).
    let (number, app_protocol) = match (port, ports.as_slice()) {
        (Some(p), []) => (p, None),
        (Some(p), listed) => match listed.iter().find(|sp| sp.port == p) {
            Some(sp) => (p, sp.app_protocol.clone()),
            None => {
                return Err(TargetProblem::Port(format!(
                    "Service {name} has no port {p} (ports: {})",
                    listed
                        .iter()
                        .map(|sp| sp.port.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        },
        (None, [one]) => (one.port, one.app_protocol.clone()),
        (None, listed) => {
            return Err(TargetProblem::Port(format!(
                "ExternalName Service {name} has {} ports: set targetRef.port",
                listed.len()
            )))
        }
    };
    let port = u16::try_from(number)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| TargetProblem::Port(format!("port {number} is not in 1..=65535")))?;
    let host = external.trim_end_matches('.').to_ascii_lowercase();
    Ok(SnapshotUpstream {
        name: upstream_name(&name, &namespace),
        hosts: hosts(&name, &namespace, client_namespace),
        protocol: protocol_of(app_protocol.as_deref()),
        dns: vec![SnapshotDnsEndpoint {
            host: host.clone(),
            port,
        }],
        host_rewrite: Some(host),
        ..Default::default()
    })
}

/// The protocol a Service port's `appProtocol` names (GEP-1911): h2c for
/// `kubernetes.io/h2c`, else HTTP/1.1.
fn protocol_of(app_protocol: Option<&str>) -> Protocol {
    match app_protocol {
        Some("kubernetes.io/h2c") | Some("h2c") => Protocol::H2c,
        _ => Protocol::Http1,
    }
}

/// Resolves the Service port clients call and the upstream it leads to;
/// `slices` are the Service's EndpointSlices.
pub(crate) fn resolve<'a>(
    service: Option<&Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    port: Option<i32>,
    client_namespace: &str,
) -> Result<SnapshotUpstream, TargetProblem> {
    let service = service.ok_or(TargetProblem::NotFound)?;
    let name = service.metadata.name.clone().unwrap_or_default();
    let namespace = service.metadata.namespace.clone().unwrap_or_default();
    if let Some(external) = external_name(service) {
        return resolve_external(service, external, port, client_namespace);
    }
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    let chosen = match port {
        Some(p) => ports.iter().find(|sp| sp.port == p).ok_or_else(|| {
            let have: Vec<String> = ports.iter().map(|sp| sp.port.to_string()).collect();
            TargetProblem::Port(format!(
                "Service {name} has no port {p} (ports: {})",
                have.join(", ")
            ))
        })?,
        None if ports.len() == 1 => &ports[0],
        None => {
            return Err(TargetProblem::Port(format!(
                "Service {name} has {} ports: set targetRef.port",
                ports.len()
            )))
        }
    };
    let protocol = protocol_of(chosen.app_protocol.as_deref());
    let mut endpoints = Vec::new();
    for slice in slices {
        // The slice port that serves this Service port, matched by name.
        let Some(target) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| {
                p.name == chosen.name
                    || (chosen.name.is_none() && slice.ports.as_ref().is_some_and(|v| v.len() == 1))
            })
            .and_then(|p| p.port)
        else {
            continue;
        };
        for ep in &slice.endpoints {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let terminating = ep
                .conditions
                .as_ref()
                .and_then(|c| c.terminating)
                .unwrap_or(false);
            if !ready || terminating {
                continue;
            }
            let pod = ep
                .target_ref
                .as_ref()
                .filter(|r| r.kind.as_deref() == Some("Pod"))
                .and_then(|r| r.name.clone());
            for address in &ep.addresses {
                endpoints.push(SnapshotEndpoint {
                    address: address.clone(),
                    port: u16::try_from(target).unwrap_or(0),
                    pod: pod.clone(),
                    zone: ep.zone.clone(),
                });
            }
        }
    }
    endpoints.sort_by(|a, b| (&a.address, a.port).cmp(&(&b.address, b.port)));
    endpoints.dedup();
    Ok(SnapshotUpstream {
        name: upstream_name(&name, &namespace),
        hosts: hosts(&name, &namespace, client_namespace),
        protocol,
        endpoints,
        addresses: virtual_addresses(service, chosen.port),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{service, slice};

    #[test]
    fn ready_endpoints_with_pod_names_and_target_port() {
        let svc = service(serde_json::json!([{ "name": "http", "port": 80, "targetPort": 8080 }]));
        let s = slice(
            "api-abc",
            serde_json::json!([
                { "addresses": ["127.0.0.12"], "conditions": { "ready": true }, "targetRef": { "kind": "Pod", "name": "api-2" }, "zone": "z1" },
                { "addresses": ["127.0.0.11"], "conditions": { "ready": true }, "targetRef": { "kind": "Pod", "name": "api-1" } },
                { "addresses": ["127.0.0.13"], "conditions": { "ready": false }, "targetRef": { "kind": "Pod", "name": "api-3" } },
                { "addresses": ["127.0.0.14"], "conditions": { "ready": true, "terminating": true }, "targetRef": { "kind": "Pod", "name": "api-4" } }
            ]),
        );
        let up = resolve(Some(&svc), [&s], None, "shop").expect("resolved");
        assert_eq!(up.name, "api.shop");
        assert_eq!(
            up.hosts,
            vec![
                "api",
                "api.shop",
                "api.shop.svc",
                "api.shop.svc.cluster.local"
            ]
        );
        let got: Vec<(&str, u16, Option<&str>)> = up
            .endpoints
            .iter()
            .map(|e| (e.address.as_str(), e.port, e.pod.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("127.0.0.11", 8080, Some("api-1")),
                ("127.0.0.12", 8080, Some("api-2"))
            ]
        );
        assert_eq!(up.endpoints[1].zone.as_deref(), Some("z1"));
    }

    #[test]
    fn an_external_name_service_is_a_dns_named_endpoint_and_the_host_every_attempt_carries() {
        let external = |ports: serde_json::Value| -> Service {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "payments", "namespace": "shop" },
                "spec": { "type": "ExternalName", "externalName": "API.Payments.Example.", "ports": ports }
            }))
            .expect("service")
        };
        let up = resolve(
            Some(&external(serde_json::json!([{ "port": 443 }]))),
            [],
            None,
            "shop",
        )
        .expect("resolved");
        assert_eq!(up.name, "payments.shop");
        assert_eq!(up.hosts[0], "payments");
        assert!(up.endpoints.is_empty() && up.addresses.is_empty());
        assert_eq!(
            up.dns,
            vec![SnapshotDnsEndpoint {
                host: "api.payments.example".into(),
                port: 443
            }]
        );
        assert_eq!(up.host_rewrite.as_deref(), Some("api.payments.example"));
        assert_eq!(up.protocol, Protocol::Http1);
        // No ports listed: targetRef.port is the port; h2c from appProtocol.
        let up = resolve(
            Some(&external(serde_json::json!(null))),
            [],
            Some(8443),
            "shop",
        )
        .expect("resolved");
        assert_eq!(up.dns[0].port, 8443);
        let h2c = external(
            serde_json::json!([{ "port": 80, "appProtocol": "kubernetes.io/h2c" }, { "port": 443 }]),
        );
        assert_eq!(
            resolve(Some(&h2c), [], Some(80), "shop").map(|u| u.protocol),
            Ok(Protocol::H2c)
        );
        assert!(
            matches!(resolve(Some(&h2c), [], None, "shop"), Err(TargetProblem::Port(m)) if m.contains("set targetRef.port"))
        );
        assert!(matches!(
            resolve(Some(&external(serde_json::json!(null))), [], None, "shop"),
            Err(TargetProblem::Port(_))
        ));
    }

    #[test]
    fn port_must_be_chosen_when_ambiguous() {
        let svc = service(
            serde_json::json!([{ "name": "http", "port": 80 }, { "name": "grpc", "port": 9090, "appProtocol": "kubernetes.io/h2c" }]),
        );
        assert!(
            matches!(resolve(Some(&svc), [], None, "shop"), Err(TargetProblem::Port(m)) if m.contains("set targetRef.port"))
        );
        assert!(
            matches!(resolve(Some(&svc), [], Some(81), "shop"), Err(TargetProblem::Port(m)) if m.contains("no port 81"))
        );
        assert_eq!(
            resolve(Some(&svc), [], Some(9090), "shop")
                .expect("grpc")
                .protocol,
            Protocol::H2c
        );
        assert_eq!(
            resolve(None, [], None, "shop"),
            Err(TargetProblem::NotFound)
        );
        let other_ns = resolve(Some(&svc), [], Some(80), "web").expect("resolved");
        assert_eq!(
            other_ns.hosts[0], "api.shop",
            "the short name only works in the same namespace"
        );
    }

    #[test]
    fn virtual_addresses_are_the_cluster_ips_with_the_service_port() {
        let mut svc =
            service(serde_json::json!([{ "name": "http", "port": 80, "targetPort": 8080 }]));
        let spec = svc.spec.as_mut().expect("spec");
        spec.cluster_ip = Some("10.96.0.10".into());
        spec.cluster_ips = Some(vec!["10.96.0.10".into(), "fd00::10".into()]);
        let up = resolve(Some(&svc), [], None, "shop").expect("resolved");
        assert_eq!(up.addresses, vec!["10.96.0.10:80", "[fd00::10]:80"]);

        let spec = svc.spec.as_mut().expect("spec");
        spec.cluster_ip = Some("None".into());
        spec.cluster_ips = Some(vec!["None".into()]);
        let headless = resolve(Some(&svc), [], None, "shop").expect("resolved");
        assert!(headless.addresses.is_empty(), "{:?}", headless.addresses);
    }
}
