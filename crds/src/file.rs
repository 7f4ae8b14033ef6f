//! The standalone configuration file (`reprise-sidecar --config FILE`).
//!
//! The gateway format loads unchanged (`examples/gateway.yaml`): `upstreams:`
//! with `name`, `endpoints` of `{address, port}`, `timeouts` and a `retries`
//! block. Retry rules sit beside it under `rules:`. Field names are
//! snake_case; unknown fields are refused so a typo never silently turns a
//! setting off (`docs/src/reference/file-format.md`).

pub(crate) mod common;
mod deadlines;
mod read;
mod retries;
mod rules;
mod tls;

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use self::deadlines::DeadlinesSpec;
pub use self::read::{read, FileText, MAX_FILE_BYTES};
pub use self::retries::{HedgeSpec, RetriesSpec, StatusEntry};
pub use self::rules::RuleSpec;
pub use self::tls::TlsSpec;
use crate::config::{Config, DnsEndpoint, Endpoint, PassiveHealth, ProxySettings, Rule, Upstream};
use crate::policy::{Protocol, DEFAULT_REPLAY_RESERVATION_BYTES};
use crate::validation::ValidationErrors;
use crate::Error;

/// The file as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Named groups of interchangeable endpoints.
    pub upstreams: Vec<UpstreamSpec>,
    /// Retry rules, evaluated by priority then id; the first enabled match wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleSpec>,
    /// Process-wide settings.
    #[serde(default)]
    pub proxy: ProxySpec,
}

/// One upstream as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSpec {
    /// The host name requests use to address this upstream.
    pub name: String,
    /// Endpoints, as `{ address, port }`.
    pub endpoints: Vec<EndpointSpec>,
    /// Other host names that route to this upstream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// Virtual addresses (`IP:PORT`, e.g. a Service's ClusterIP) whose
    /// transparently captured connections go to this upstream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// `http1` (default), `h2c`, or with `tls` `h2` (HTTP/2 over TLS).
    #[serde(default)]
    pub protocol: Protocol,
    /// TLS the sidecar originates towards the endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// The host every attempt carries (`Host` or `:authority`) instead of
    /// the one the application sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_rewrite: Option<String>,
    /// Connect and per-attempt read timeouts.
    #[serde(default)]
    pub timeouts: TimeoutsSpec,
    /// The upstream's own retries block; no keys means retries off.
    #[serde(default)]
    pub retries: RetriesSpec,
    /// Passive health (ejection after consecutive transport failures).
    #[serde(default)]
    pub passive_health: PassiveHealthSpec,
}

/// One endpoint as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// IP address (or, instead, `host`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// A DNS name whose every address is an endpoint (instead of `address`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// TCP port.
    pub port: u16,
    /// Optional name (a pod name in Kubernetes), shown in traces and logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Optional topology zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// `timeouts` as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsSpec {
    /// Connect timeout in milliseconds (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_ms: Option<u64>,
    /// Per-attempt wait for response headers in milliseconds (default 15000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_ms: Option<u64>,
}

/// `passive_health` as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PassiveHealthSpec {
    /// Consecutive transport or mid-stream failures that eject an endpoint (default 5; 0 = never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// Ejection time in milliseconds (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ejection_ms: Option<u64>,
}

/// `proxy` as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySpec {
    /// Bytes all replay buffers together may hold (default 64 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_reservation_bytes: Option<u64>,
    /// Drain time after SIGTERM in milliseconds (default 15000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout_ms: Option<u64>,
    /// Largest request head in bytes (default 65536, at least 8192).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_header_bytes: Option<usize>,
    /// One structured log event per request (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log: Option<bool>,
    /// Retried or failed requests the admin `/diagnostics` page keeps
    /// (default 100; 0 turns it off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostics_retained: Option<usize>,
    /// Client connections the proxy listener (and apart from it the
    /// transparent listeners) holds open at once (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u64>,
    /// DNS servers (`IP:PORT`) for host-named endpoints (default: the
    /// system's resolver configuration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_resolvers: Vec<String>,
    /// Deadlines across hops for every request of this sidecar; a rule's
    /// own `deadlines` may turn a way off for its requests, never on.
    #[serde(default, skip_serializing_if = "DeadlinesSpec::is_empty")]
    pub deadlines: DeadlinesSpec,
    /// Let host-named endpoints resolve to loopback and link-local
    /// addresses (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_allow_local: Option<bool>,
}

/// Default connect timeout.
pub const DEFAULT_CONNECT_MS: u64 = 1_000;
/// Default per-attempt read timeout.
pub const DEFAULT_READ_MS: u64 = 15_000;
/// Default cap on the client connections the proxy listener, and apart from
/// it the transparent listeners, hold open: far above what one pod's
/// application opens at once, so only a runaway client meets it. Where the
/// process's open-file limit is lower, the file should set it lower.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 10_000;
/// Default number of retried or failed requests `/diagnostics` keeps.
pub const DEFAULT_DIAGNOSTICS_RETAINED: usize = 100;
/// Most requests `/diagnostics` may keep: each entry's strings are capped
/// (about 5 KiB at worst, a few hundred bytes usually), so a full ring stays
/// within a few MiB.
pub const MAX_DIAGNOSTICS_RETAINED: usize = 1_000;

/// Reads (see [`read`]), parses and validates the file at `path`.
pub fn load(path: &Path) -> Result<Config, Error> {
    parse(&read(path)?.text, &path.display().to_string())
}

/// Parses and validates configuration text; `label` names it in errors.
pub fn parse(text: &str, label: &str) -> Result<Config, Error> {
    let file: ConfigFile = serde_yaml::from_str(text).map_err(|source| Error::Parse {
        path: label.to_string(),
        source,
    })?;
    file.resolve().map_err(|source| Error::Invalid {
        path: label.to_string(),
        source,
    })
}

impl ConfigFile {
    /// Validates every field and resolves defaults. Reports every broken rule.
    ///
    /// Linear in the file's size: each uniqueness rule looks the earlier
    /// entries up in a map of each name's or address's first index, never by
    /// going through them again (pairwise, a reload of tens of thousands of
    /// upstreams held a thread for seconds to minutes).
    pub fn resolve(&self) -> Result<Config, ValidationErrors> {
        let mut errs = ValidationErrors::default();
        let mut upstreams = Vec::with_capacity(self.upstreams.len());
        if self.upstreams.is_empty() {
            errs.push("upstreams", "must list at least one upstream");
        }
        // Names compare without case: each one's first upstream.
        let mut names: HashMap<String, usize> = HashMap::with_capacity(self.upstreams.len());
        for (i, u) in self.upstreams.iter().enumerate() {
            let p = format!("upstreams[{i}]");
            match names.entry(u.name.to_ascii_lowercase()) {
                Entry::Occupied(first) => errs.push(
                    format!("{p}.name"),
                    format!(
                        "must be unique (\"{}\" is also upstreams[{}])",
                        u.name,
                        first.get()
                    ),
                ),
                Entry::Vacant(v) => {
                    v.insert(i);
                }
            }
            upstreams.push(u.resolve(&p, &mut errs));
        }
        // Each virtual address's first upstream (an upstream's own repeats
        // are refused where its list is read).
        let mut addresses: HashMap<SocketAddr, usize> = HashMap::new();
        for (i, u) in upstreams.iter().enumerate() {
            for (k, a) in u.addresses.iter().enumerate() {
                let first = *addresses.entry(*a).or_insert(i);
                if first != i {
                    errs.push(
                        format!("upstreams[{i}].addresses[{k}]"),
                        format!("must be unique ({a} is also an address of upstreams[{first}])"),
                    );
                }
            }
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        let mut ids: HashMap<&str, usize> = HashMap::with_capacity(self.rules.len());
        for (i, r) in self.rules.iter().enumerate() {
            let p = format!("rules[{i}]");
            let first = *ids.entry(r.id.as_str()).or_insert(i);
            if first != i {
                errs.push(
                    format!("{p}.id"),
                    format!("must be unique (\"{}\" is also rules[{first}])", r.id),
                );
            }
            for (k, name) in r.upstreams.iter().enumerate() {
                if !names.contains_key(&name.to_ascii_lowercase()) {
                    errs.push(
                        format!("{p}.upstreams[{k}]"),
                        format!("no upstream named \"{name}\""),
                    );
                }
            }
            rules.push(r.resolve(&p, &mut errs));
        }
        rules.sort_by(Rule::order);
        let proxy = self.proxy.resolve(&mut errs);
        errs.into_result(Config {
            upstreams,
            rules,
            proxy,
        })
    }
}

impl UpstreamSpec {
    fn resolve(&self, p: &str, errs: &mut ValidationErrors) -> Upstream {
        if !common::is_dns_name(&self.name) {
            errs.push(
                format!("{p}.name"),
                format!(
                    "must be a DNS name: lowercase letters, digits, '-' and '.', at most 253 characters (got \"{}\")",
                    self.name
                ),
            );
        }
        if self.endpoints.is_empty() {
            errs.push(format!("{p}.endpoints"), "must list at least one endpoint");
        }
        for (i, alias) in self.aliases.iter().enumerate() {
            if !common::is_dns_name(alias) {
                errs.push(
                    format!("{p}.aliases[{i}]"),
                    format!("must be a DNS name (got \"{alias}\")"),
                );
            }
        }
        let mut endpoints = Vec::with_capacity(self.endpoints.len());
        let mut dns = Vec::new();
        // Each address (or host) and port's first endpoint, as written.
        let mut seen: HashMap<(Cow<'_, str>, u16), usize> =
            HashMap::with_capacity(self.endpoints.len());
        for (i, e) in self.endpoints.iter().enumerate() {
            let ep = format!("{p}.endpoints[{i}]");
            match (&e.host, e.address.is_empty()) {
                (Some(_), false) => {
                    errs.push(ep.clone(), "must have an address or a host, not both")
                }
                (None, true) => errs.push(format!("{ep}.address"), "must be set (or host)"),
                (Some(host), true) => {
                    let host = host.to_ascii_lowercase();
                    if common::is_dns_name(&host) {
                        dns.push(DnsEndpoint {
                            host,
                            port: e.port,
                            zone: e.zone.clone(),
                        });
                    } else {
                        errs.push(
                            format!("{ep}.host"),
                            format!("must be a DNS name (got \"{host}\")"),
                        );
                    }
                }
                (None, false) => match e.address.parse::<IpAddr>() {
                    Ok(ip) => endpoints.push(Endpoint {
                        addr: SocketAddr::new(ip, e.port),
                        name: e.name.as_deref().map(Into::into),
                        zone: e.zone.as_deref().map(Into::into),
                    }),
                    Err(_) => errs.push(
                        format!("{ep}.address"),
                        format!("must be an IPv4 or IPv6 address (got \"{}\")", e.address),
                    ),
                },
            }
            if e.port == 0 {
                errs.push(format!("{ep}.port"), "must be in 1..=65535 (got 0)");
            }
            // Names compare as DNS compares them, without case.
            let at: Cow<'_, str> = match &e.host {
                Some(h) if h.bytes().any(|b| b.is_ascii_uppercase()) => {
                    Cow::Owned(h.to_ascii_lowercase())
                }
                Some(h) => Cow::Borrowed(h),
                None => Cow::Borrowed(&e.address),
            };
            let j = *seen.entry((at, e.port)).or_insert(i);
            if j != i {
                errs.push(
                    ep.clone(),
                    format!(
                        "must be unique ({}:{} is also endpoints[{j}])",
                        e.host.as_deref().unwrap_or(&e.address),
                        e.port
                    ),
                );
            }
        }
        let connect_ms = common::ranged(
            errs,
            &format!("{p}.timeouts.connect_ms"),
            self.timeouts.connect_ms,
            DEFAULT_CONNECT_MS,
            1,
            600_000,
        );
        let read_ms = common::ranged(
            errs,
            &format!("{p}.timeouts.read_ms"),
            self.timeouts.read_ms,
            DEFAULT_READ_MS,
            1,
            3_600_000,
        );
        let (retries, budget) = self.retries.resolve(&format!("{p}.retries"), errs);
        let consecutive_failures = common::ranged(
            errs,
            &format!("{p}.passive_health.consecutive_failures"),
            self.passive_health.consecutive_failures.map(u64::from),
            5,
            0,
            1_000,
        );
        let ejection_ms = common::ranged(
            errs,
            &format!("{p}.passive_health.ejection_ms"),
            self.passive_health.ejection_ms,
            30_000,
            1,
            3_600_000,
        );
        let tls = self.resolve_tls(p, &dns, errs);
        let host_rewrite = self.host_rewrite.as_ref().map(|h| {
            if !is_host(h) {
                errs.push(
                    format!("{p}.host_rewrite"),
                    format!(
                        "must be a host name or an IP address, with an optional port (got \"{h}\")"
                    ),
                );
            }
            h.to_ascii_lowercase()
        });
        Upstream {
            tls,
            host_rewrite,
            dns,
            name: self.name.to_ascii_lowercase(),
            aliases: self.aliases.clone(),
            addresses: common::addresses(errs, &format!("{p}.addresses"), &self.addresses),
            endpoints,
            protocol: self.protocol,
            connect_timeout: Duration::from_millis(connect_ms),
            read_timeout: Some(Duration::from_millis(read_ms)),
            retries,
            budget,
            passive_health: PassiveHealth {
                consecutive_failures: u32::try_from(consecutive_failures).unwrap_or(u32::MAX),
                ejection: Duration::from_millis(ejection_ms),
            },
        }
    }
}

/// A host as a `Host` header carries it: a DNS name or an IP address
/// (IPv6 in brackets), and an optional port.
fn is_host(host: &str) -> bool {
    let Ok(authority) = host.parse::<http::uri::Authority>() else {
        return false;
    };
    let name = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    authority.as_str() == host
        && (common::is_dns_name(&name.to_ascii_lowercase()) || name.parse::<IpAddr>().is_ok())
}

impl ProxySpec {
    fn resolve(&self, errs: &mut ValidationErrors) -> ProxySettings {
        let reservation = common::ranged(
            errs,
            "proxy.replay_reservation_bytes",
            self.replay_reservation_bytes,
            DEFAULT_REPLAY_RESERVATION_BYTES,
            0,
            1 << 30,
        );
        let drain = common::ranged(
            errs,
            "proxy.drain_timeout_ms",
            self.drain_timeout_ms,
            15_000,
            0,
            600_000,
        );
        let header = common::ranged(
            errs,
            "proxy.max_request_header_bytes",
            self.max_request_header_bytes.map(|v| v as u64),
            65_536,
            8_192,
            1 << 20,
        );
        let max_connections = common::ranged(
            errs,
            "proxy.max_connections",
            self.max_connections,
            DEFAULT_MAX_CONNECTIONS,
            1,
            1_000_000,
        );
        let diagnostics = common::ranged(
            errs,
            "proxy.diagnostics_retained",
            self.diagnostics_retained.map(|v| v as u64),
            DEFAULT_DIAGNOSTICS_RETAINED as u64,
            0,
            MAX_DIAGNOSTICS_RETAINED as u64,
        );
        ProxySettings {
            replay_reservation_bytes: reservation,
            drain_timeout: Duration::from_millis(drain),
            max_request_header_bytes: usize::try_from(header).unwrap_or(65_536),
            max_connections,
            access_log: self.access_log.unwrap_or(true),
            diagnostics_retained: usize::try_from(diagnostics)
                .unwrap_or(DEFAULT_DIAGNOSTICS_RETAINED),
            forward_unknown_hosts: false,
            dns_allow_local: self.dns_allow_local.unwrap_or(false),
            dns_resolvers: self
                .dns_resolvers
                .iter()
                .enumerate()
                .filter_map(|(i, r)| match r.parse::<SocketAddr>() {
                    Ok(addr) => Some(addr),
                    Err(_) => {
                        errs.push(
                            format!("proxy.dns_resolvers[{i}]"),
                            format!("must be IP:PORT (got \"{r}\")"),
                        );
                        None
                    }
                })
                .collect(),
            deadlines: self.deadlines.resolve(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(name: &str, port: u16, address: &str) -> UpstreamSpec {
        UpstreamSpec {
            name: name.to_string(),
            endpoints: vec![EndpointSpec {
                address: "10.0.0.1".into(),
                port,
                ..EndpointSpec::default()
            }],
            addresses: vec![address.to_string()],
            ..UpstreamSpec::default()
        }
    }

    fn errors(file: &ConfigFile) -> Vec<String> {
        match file.resolve() {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn each_repeat_names_the_first_occurrence_across_many_upstreams() {
        // Many upstreams, each name and address once, then repeats of the
        // first and of one in the middle: every repeat names the first.
        let n: u16 = 20_000;
        let mut file = ConfigFile::default();
        for i in 0..n {
            let (a, b) = (i / 250, i % 250);
            file.upstreams.push(upstream(
                &format!("svc-{i}"),
                i + 1,
                &format!("10.96.{a}.{b}:80"),
            ));
        }
        file.upstreams.push(upstream("SVC-0", 1, "10.96.0.0:80"));
        file.upstreams.push(upstream("svc-0", 2, "10.96.40.0:80"));
        file.upstreams[0].endpoints.push(EndpointSpec {
            address: "10.0.0.1".into(),
            port: 1,
            ..EndpointSpec::default()
        });
        file.rules = ["a", "b", "a", "a"]
            .iter()
            .map(|id| RuleSpec {
                id: (*id).to_string(),
                upstreams: vec!["Svc-19999".into(), "nowhere".into()],
                ..RuleSpec::default()
            })
            .collect();
        let n = usize::from(n);
        let (last, next) = (n, n + 1);
        assert_eq!(
            errors(&file),
            [
                "upstreams[0].endpoints[1]: must be unique (10.0.0.1:1 is also endpoints[0])".to_string(),
                format!("upstreams[{last}].name: must be unique (\"SVC-0\" is also upstreams[0])"),
                format!("upstreams[{last}].name: must be a DNS name: lowercase letters, digits, '-' and '.', at most 253 characters (got \"SVC-0\")"),
                format!("upstreams[{next}].name: must be unique (\"svc-0\" is also upstreams[0])"),
                format!("upstreams[{last}].addresses[0]: must be unique (10.96.0.0:80 is also an address of upstreams[0])"),
                format!("upstreams[{next}].addresses[0]: must be unique (10.96.40.0:80 is also an address of upstreams[10000])"),
                "rules[0].upstreams[1]: no upstream named \"nowhere\"".to_string(),
                "rules[1].upstreams[1]: no upstream named \"nowhere\"".to_string(),
                "rules[2].id: must be unique (\"a\" is also rules[0])".to_string(),
                "rules[2].upstreams[1]: no upstream named \"nowhere\"".to_string(),
                "rules[3].id: must be unique (\"a\" is also rules[0])".to_string(),
                "rules[3].upstreams[1]: no upstream named \"nowhere\"".to_string(),
            ]
        );
    }
}
