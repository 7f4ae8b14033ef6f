//! An upstream's `tls` block: its files read and checked where the file is,
//! the server name's default, and the protocols that need or refuse TLS.

use std::net::IpAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{common, UpstreamSpec};
use crate::config::{DnsEndpoint, TrustAnchors, UpstreamTls};
use crate::policy::Protocol;
use crate::tls::IdentityField;
use crate::validation::ValidationErrors;

/// `tls` as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    /// SNI and the name verified (default: the upstream's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// A PEM bundle of trusted roots (default: the public roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// A PEM certificate chain to present when the endpoint asks for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_file: Option<String>,
    /// The PEM private key of `client_cert_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key_file: Option<String>,
    /// Names (DNS names or IP addresses) the certificate may carry instead
    /// of `server_name`, which is still sent as SNI; one must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
}

impl UpstreamSpec {
    /// The `tls` block, and the protocols that need or refuse it.
    pub(super) fn resolve_tls(
        &self,
        p: &str,
        dns: &[DnsEndpoint],
        errs: &mut ValidationErrors,
    ) -> Option<UpstreamTls> {
        let Some(tls) = &self.tls else {
            match self.protocol {
                Protocol::H2 => errs.push(
                    format!("{p}.protocol"),
                    "h2 is HTTP/2 over TLS and needs a tls block (cleartext HTTP/2 is h2c)",
                ),
                Protocol::Auto => errs.push(
                    format!("{p}.protocol"),
                    "auto lets the endpoint choose through TLS (ALPN) and needs a tls block",
                ),
                Protocol::Http1 | Protocol::H2c => {}
            }
            return None;
        };
        if self.protocol == Protocol::H2c {
            errs.push(
                format!("{p}.protocol"),
                "h2c is cleartext HTTP/2 and cannot have a tls block (HTTP/2 over TLS is h2)",
            );
        }
        let t = format!("{p}.tls");
        // Default: the endpoints' host name when they share one, else the
        // upstream's name; host-named endpoints of different names must say
        // which name they all answer to.
        let mut hosts: Vec<&str> = dns.iter().map(|d| d.host.as_str()).collect();
        hosts.sort_unstable();
        hosts.dedup();
        let server_name = match (&tls.server_name, hosts.as_slice()) {
            (Some(name), _) => name.clone(),
            (None, []) => self.name.to_ascii_lowercase(),
            (None, [one]) => one.to_string(),
            (None, _) => {
                errs.push(
                    format!("{t}.server_name"),
                    "must be set when host-named endpoints have different names",
                );
                self.name.to_ascii_lowercase()
            }
        };
        let valid_name = (common::is_dns_name(&server_name)
            || server_name.parse::<IpAddr>().is_ok())
            && rustls::pki_types::ServerName::try_from(server_name.as_str()).is_ok();
        if !valid_name {
            errs.push(
                format!("{t}.server_name"),
                format!("must be a DNS name or an IP address (got \"{server_name}\")"),
            );
        }
        let trust = match &tls.ca_file {
            None => TrustAnchors::WellKnown,
            Some(file) => match crate::tls::read_bundle(Path::new(file)) {
                Ok(bundle) => TrustAnchors::Bundle(bundle),
                Err(rule) => {
                    errs.push(format!("{t}.ca_file"), rule);
                    TrustAnchors::WellKnown
                }
            },
        };
        let client_identity = match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(cert), Some(key)) => {
                match crate::tls::read_identity(Path::new(cert), Path::new(key)) {
                    Ok(identity) => Some(identity),
                    Err((field, rule)) => {
                        let field = match field {
                            IdentityField::Cert => "client_cert_file",
                            IdentityField::Key => "client_key_file",
                        };
                        errs.push(format!("{t}.{field}"), rule);
                        None
                    }
                }
            }
            (None, None) => None,
            (Some(_), None) => {
                errs.push(
                    format!("{t}.client_key_file"),
                    "must be set with client_cert_file (both or neither)",
                );
                None
            }
            (None, Some(_)) => {
                errs.push(
                    format!("{t}.client_cert_file"),
                    "must be set with client_key_file (both or neither)",
                );
                None
            }
        };
        let subject_alt_names = tls
            .subject_alt_names
            .iter()
            .enumerate()
            .filter_map(|(i, name)| {
                let name = name.to_ascii_lowercase();
                if rustls::pki_types::ServerName::try_from(name.as_str()).is_ok() {
                    Some(name)
                } else {
                    errs.push(
                        format!("{t}.subject_alt_names[{i}]"),
                        format!("must be a DNS name or an IP address (got \"{name}\")"),
                    );
                    None
                }
            })
            .collect();
        Some(UpstreamTls {
            server_name,
            subject_alt_names,
            trust,
            client_identity,
        })
    }
}
