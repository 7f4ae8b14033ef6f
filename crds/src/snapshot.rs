//! The configuration snapshot the controller pushes to one sidecar: the
//! policies that apply to it and the ready endpoints of their targets.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{
    BudgetSettings, Config, DnsEndpoint, Endpoint, PassiveHealth, ProxySettings, Rule,
    TrustAnchors, Upstream, UpstreamTls,
};
use crate::file::{
    DEFAULT_CONNECT_MS, DEFAULT_DIAGNOSTICS_RETAINED, DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_MS,
};
use crate::policy::{Protocol, DEFAULT_REPLAY_RESERVATION_BYTES};
use crate::retry_rule::RetryRule;
use crate::validation::ValidationErrors;

mod delta;
mod route;

pub use route::{RouteKind, RouteMatch, SnapshotRoute, MAX_MATCHES};

pub use delta::{
    DeltaLine, EndpointsPatch, Entries, PolicyEntry, PolicyRef, SnapshotDelta, UpstreamDigest,
    UpstreamEntry, DELTA_PREFIX,
};

/// A versioned snapshot for one sidecar.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// Content hash of everything below; equal snapshots have equal versions on
    /// every controller replica, so a reconnecting sidecar can resume.
    pub version: String,
    /// Target Services and their ready endpoints.
    pub upstreams: Vec<SnapshotUpstream>,
    /// Policies that apply to this sidecar.
    pub policies: Vec<SnapshotPolicy>,
}

/// A target Service.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotUpstream {
    /// `service.namespace`.
    pub name: String,
    /// Host names clients use for it (`service`, `service.namespace`, `...svc`, `...svc.cluster.local`).
    pub hosts: Vec<String>,
    /// Protocol to the pods (`http1` or `h2c`, from the Service port's appProtocol).
    #[serde(default)]
    pub protocol: Protocol,
    /// Ready endpoints.
    pub endpoints: Vec<SnapshotEndpoint>,
    /// The Service's virtual addresses (`ClusterIP:port`, one per cluster
    /// IP) for transparently captured connections; none for a headless Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Endpoints named by DNS (an `ExternalName` Service's name), which the
    /// sidecar resolves: every address is an endpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns: Vec<SnapshotDnsEndpoint>,
    /// The `Host` every attempt carries instead of the application's (an
    /// `ExternalName` Service's external name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_rewrite: Option<String>,
    /// TLS towards the endpoints (a BackendTLSPolicy targets the port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<SnapshotTls>,
    /// The retry budget of every request to it, whatever rule retries
    /// (an XBackendTrafficPolicy targets the Service); none: the first
    /// policy's, by precedence, priority and id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<SnapshotBudget>,
}

/// A Service's retry budget, as Gateway API's `retryConstraint` gives it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotBudget {
    /// Share of requests that may be retries, in 0..=100 (0: only the floor).
    pub percent: f64,
    /// The rolling window, in milliseconds (1 s to 1 h).
    pub interval_ms: u64,
    /// Retries always allowed on top of the percentage: `count` per `per_ms`.
    #[serde(default)]
    pub min_retries: u32,
    /// The period of `min_retries`, in milliseconds (1 s to 1 h).
    #[serde(default = "one_second")]
    pub min_retries_per_ms: u64,
}

fn one_second() -> u64 {
    1_000
}

impl SnapshotBudget {
    /// The sidecar's budget settings, or the rules it breaks (under `p`).
    pub fn resolve(&self, p: &str, errs: &mut ValidationErrors) -> BudgetSettings {
        if !(0.0..=100.0).contains(&self.percent) {
            errs.push(
                format!("{p}.percent"),
                format!("must be in 0..=100 (got {})", self.percent),
            );
        }
        for (field, ms) in [
            ("intervalMs", self.interval_ms),
            ("minRetriesPerMs", self.min_retries_per_ms),
        ] {
            if !(1_000..=3_600_000).contains(&ms) {
                errs.push(
                    format!("{p}.{field}"),
                    format!("must be in 1000..=3600000 (1 s to 1 h; got {ms})"),
                );
            }
        }
        BudgetSettings {
            percent: self.percent,
            window: Duration::from_millis(self.interval_ms.clamp(1_000, 3_600_000)),
            min_retries_per_second: f64::from(self.min_retries) * 1_000.0
                / self.min_retries_per_ms.clamp(1_000, 3_600_000) as f64,
        }
    }
}

/// A DNS name whose every address is an endpoint, on `port`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotDnsEndpoint {
    /// The name.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// TLS to an upstream's endpoints, as a BackendTLSPolicy asks for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotTls {
    /// SNI and the name verified (`validation.hostname`).
    pub server_name: String,
    /// The PEM bundle of `validation.caCertificateRefs`; none: the public
    /// roots (`wellKnownCACertificates: System`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
    /// Names the certificate must carry one of instead of `serverName`
    /// (`validation.subjectAltNames` of type Hostname).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
}

impl SnapshotUpstream {
    /// The capabilities ([`crate::protocol::CAPABILITIES_HEADER`]) a sidecar
    /// needs to run this upstream as meant.
    pub fn needs(&self) -> Vec<&'static str> {
        let mut needs = Vec::new();
        if self.tls.is_some() || self.protocol.needs_tls() {
            needs.push(crate::protocol::CAPABILITY_TLS);
        }
        if !self.dns.is_empty() || self.host_rewrite.is_some() {
            needs.push(crate::protocol::CAPABILITY_DNS);
        }
        if self.budget.is_some() {
            needs.push(crate::protocol::CAPABILITY_ROUTES);
        }
        needs
    }
}

/// A ready pod endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotEndpoint {
    /// Pod IP.
    pub address: String,
    /// Target port.
    pub port: u16,
    /// Pod name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Topology zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl SnapshotEndpoint {
    /// The endpoint the sidecar dials, or the rule its address breaks. One
    /// check for a whole snapshot and for an endpoint patch.
    pub fn resolve(&self) -> Result<Endpoint, String> {
        match self.address.parse::<IpAddr>() {
            Ok(ip) => Ok(Endpoint {
                addr: SocketAddr::new(ip, self.port),
                name: self.pod.as_deref().map(Into::into),
                zone: self.zone.as_deref().map(Into::into),
            }),
            Err(_) => Err(format!(
                "must be an IPv4 or IPv6 address (got \"{}\")",
                self.address
            )),
        }
    }
}

/// One RetryPolicy as a sidecar needs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotPolicy {
    /// Namespace of the RetryPolicy.
    pub namespace: String,
    /// Name of the RetryPolicy.
    pub name: String,
    /// Its metadata.generation, so ACKs can be counted per generation.
    pub generation: i64,
    /// The `name` of the upstream it targets.
    pub upstream: String,
    /// The rule.
    pub rule: RetryRule,
    /// Which source runs first for this sidecar, before `priority`: 0 for
    /// its own namespace's RetryPolicies (the only value older sidecars
    /// know), then its namespace's routes, then the Service's namespace's
    /// RetryPolicies and routes (`docs/src/concepts/precedence.md`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub precedence: u8,
    /// Set when the rule comes from a Gateway API route's rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<SnapshotRoute>,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

impl SnapshotPolicy {
    /// `namespace/name`: how ACKs, traffic reports and logs name it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The capabilities a sidecar needs to run it as meant: an older one
    /// would ignore the precedence and the route's conditions, and run a
    /// producer's rule before its own namespace's or a route's rule on every
    /// request.
    pub fn needs(&self) -> Vec<&'static str> {
        if self.route.is_some() || self.precedence != 0 {
            vec![crate::protocol::CAPABILITY_ROUTES]
        } else {
            Vec::new()
        }
    }
}

/// FNV-1a, 64 bit: a stable, fast, non-cryptographic hash.
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h = Fnv1a::default();
    for b in bytes {
        h.write_byte(b);
    }
    h.0
}

/// FNV-1a as a [`std::hash::Hasher`], for maps whose keys all come from the
/// configuration (never from a request, so no one can choose colliding keys).
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a(u64);

impl Fnv1a {
    fn write_byte(&mut self, b: u8) {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
}

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_byte(*b);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Snapshot {
    /// A snapshot with its version computed from its content.
    pub fn new(
        mut upstreams: Vec<SnapshotUpstream>,
        mut policies: Vec<SnapshotPolicy>,
    ) -> Snapshot {
        upstreams.sort_by(|a, b| a.name.cmp(&b.name));
        for u in &mut upstreams {
            u.endpoints
                .sort_by(|a, b| (&a.address, a.port).cmp(&(&b.address, b.port)));
        }
        policies.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let mut s = Snapshot {
            version: String::new(),
            upstreams,
            policies,
        };
        s.version = s.content_hash();
        s
    }

    /// True when `version` is this content's: its [`content_hash`](Self::content_hash)
    /// or, as a controller versions the snapshots of sidecars that take
    /// deltas, the [`Entries::version`] of its entries.
    pub fn version_matches(&self) -> bool {
        self.version == self.content_hash()
            || self.version == Entries::from_snapshot(self.clone()).version()
    }

    /// FNV-1a over the canonical JSON of the content (stable across processes).
    pub fn content_hash(&self) -> String {
        let json = serde_json::to_vec(&(&self.upstreams, &self.policies)).unwrap_or_default();
        format!("{:016x}", fnv1a(json))
    }

    /// Validates every policy with the shared rules and resolves the sidecar
    /// configuration. A sidecar NACKs a snapshot this refuses.
    pub fn resolve(&self) -> Result<Config, ValidationErrors> {
        let mut errs = ValidationErrors::default();
        if !self.version_matches() {
            errs.push("version", "does not match the snapshot's content");
        }
        self.resolve_content(errs)
    }

    /// Resolves the configuration without checking the version (a delta's
    /// result, whose version [`Entries::apply`] checked).
    pub fn resolve_unversioned(&self) -> Result<Config, ValidationErrors> {
        self.resolve_content(ValidationErrors::default())
    }

    fn resolve_content(&self, mut errs: ValidationErrors) -> Result<Config, ValidationErrors> {
        let mut rules = Vec::with_capacity(self.policies.len());
        let mut budgets = Vec::new();
        // Looked up by name, not by going through the list per policy.
        let names: HashSet<&str> = self.upstreams.iter().map(|u| u.name.as_str()).collect();
        for p in &self.policies {
            let id = p.id();
            if !names.contains(p.upstream.as_str()) {
                errs.push(
                    format!("{id}.upstream"),
                    format!("no upstream named \"{}\" in the snapshot", p.upstream),
                );
            }
            let (mut rule, budget) =
                p.rule
                    .resolve(&id, &p.upstream, &format!("{id}: spec"), &mut errs);
            rule.precedence = p.precedence;
            budgets.push((
                (p.precedence, rule.priority),
                id.clone(),
                p.upstream.clone(),
                budget,
            ));
            match &p.route {
                Some(route) => {
                    rules.extend(route.rules(rule, &id, &format!("{id}: route"), &mut errs))
                }
                None => rules.push(rule),
            }
        }
        rules.sort_by(Rule::order);
        // An upstream's budget is its own when it has one, else the first
        // policy's (by precedence, priority, then id) that targets it.
        budgets.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        let mut budget_of: HashMap<&str, BudgetSettings> = HashMap::with_capacity(budgets.len());
        for (i, u) in self.upstreams.iter().enumerate() {
            if let Some(b) = &u.budget {
                budget_of.insert(
                    u.name.as_str(),
                    b.resolve(&format!("upstreams[{i}].budget"), &mut errs),
                );
            }
        }
        for b in &budgets {
            budget_of.entry(b.2.as_str()).or_insert(b.3);
        }
        let mut upstreams = Vec::with_capacity(self.upstreams.len());
        for (i, u) in self.upstreams.iter().enumerate() {
            if u.protocol.needs_tls() && u.tls.is_none() {
                errs.push(
                    format!("upstreams[{i}].protocol"),
                    "h2 and auto are over TLS and need tls",
                );
            }
            if u.protocol == Protocol::H2c && u.tls.is_some() {
                errs.push(
                    format!("upstreams[{i}].protocol"),
                    "h2c is cleartext HTTP/2 and cannot have tls (HTTP/2 over TLS is h2)",
                );
            }
            let tls = u.tls.as_ref().map(|t| {
                let trust = match &t.ca_certificates {
                    None => TrustAnchors::WellKnown,
                    Some(pem) => match crate::tls::parse_bundle(
                        pem.as_bytes(),
                        "the snapshot's CA certificates",
                    ) {
                        Ok(bundle) => TrustAnchors::Bundle(bundle),
                        Err(rule) => {
                            errs.push(format!("upstreams[{i}].tls.caCertificates"), rule);
                            TrustAnchors::WellKnown
                        }
                    },
                };
                if rustls::pki_types::ServerName::try_from(t.server_name.as_str()).is_err() {
                    errs.push(
                        format!("upstreams[{i}].tls.serverName"),
                        format!(
                            "must be a DNS name or an IP address (got \"{}\")",
                            t.server_name
                        ),
                    );
                }
                for (j, name) in t.subject_alt_names.iter().enumerate() {
                    if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
                        errs.push(
                            format!("upstreams[{i}].tls.subjectAltNames[{j}]"),
                            format!("must be a DNS name or an IP address (got \"{name}\")"),
                        );
                    }
                }
                UpstreamTls {
                    subject_alt_names: t.subject_alt_names.clone(),
                    server_name: t.server_name.clone(),
                    trust,
                    client_identity: None,
                }
            });
            let mut dns = Vec::with_capacity(u.dns.len());
            for (j, d) in u.dns.iter().enumerate() {
                let host = d.host.to_ascii_lowercase();
                if !crate::file::common::is_dns_name(&host) || d.port == 0 {
                    errs.push(
                        format!("upstreams[{i}].dns[{j}]"),
                        format!(
                            "must be a DNS name and a port in 1..=65535 (got \"{}:{}\")",
                            d.host, d.port
                        ),
                    );
                    continue;
                }
                dns.push(DnsEndpoint {
                    host,
                    port: d.port,
                    zone: None,
                });
            }
            let mut endpoints = Vec::with_capacity(u.endpoints.len());
            for (j, e) in u.endpoints.iter().enumerate() {
                match e.resolve() {
                    Ok(e) => endpoints.push(e),
                    Err(rule) => errs.push(format!("upstreams[{i}].endpoints[{j}].address"), rule),
                }
            }
            let budget = budget_of
                .get(u.name.as_str())
                .copied()
                .unwrap_or(BudgetSettings {
                    percent: 10.0,
                    window: Duration::from_secs(10),
                    min_retries_per_second: 0.0,
                });
            upstreams.push(Upstream {
                tls,
                host_rewrite: u.host_rewrite.clone(),
                name: u.name.clone(),
                aliases: u.hosts.clone(),
                addresses: crate::file::common::addresses(
                    &mut errs,
                    &format!("upstreams[{i}].addresses"),
                    &u.addresses,
                ),
                endpoints,
                dns,
                protocol: u.protocol,
                connect_timeout: Duration::from_millis(DEFAULT_CONNECT_MS),
                read_timeout: Some(Duration::from_millis(DEFAULT_READ_MS)),
                retries: crate::file::RetriesSpec::default()
                    .resolve("", &mut ValidationErrors::default())
                    .0,
                budget,
                passive_health: PassiveHealth {
                    consecutive_failures: 5,
                    ejection: Duration::from_secs(30),
                },
            });
        }
        errs.into_result(Config {
            upstreams,
            rules,
            proxy: ProxySettings {
                replay_reservation_bytes: DEFAULT_REPLAY_RESERVATION_BYTES,
                drain_timeout: Duration::from_secs(15),
                max_request_header_bytes: 65_536,
                max_connections: DEFAULT_MAX_CONNECTIONS,
                access_log: true,
                // The pod's annotation replaces it (`REPRISE_DIAGNOSTICS_RETAINED`).
                diagnostics_retained: DEFAULT_DIAGNOSTICS_RETAINED,
                forward_unknown_hosts: true,
                dns_resolvers: Vec::new(),
                deadlines: crate::policy::DeadlinePolicy::ON,
                dns_allow_local: false,
            },
        })
    }
}
