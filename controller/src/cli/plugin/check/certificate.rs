//! The webhook's serving chain held against the webhook configuration's
//! caBundle as the API server holds it: the same WebPKI path validation
//! (rustls' verifier) for the Service's DNS name at a given time.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::{CertificateError, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::Install;

/// Why the chain does not do.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Problem {
    /// The answer or the bundle is not PEM certificates.
    Unreadable(String),
    /// Not signed (through the chain) by a CA of the bundle, or by one of
    /// the same name but another key.
    UnknownIssuer,
    /// Past its notAfter (when the verifier says).
    Expired(Option<u64>),
    /// Before its notBefore.
    NotYetValid,
    /// Without the name the API server verifies.
    WrongName(String),
    /// Anything else the verifier refuses.
    Other(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Unreadable(why) => write!(f, "cannot be read: {why}"),
            Problem::UnknownIssuer => f.write_str("is not signed by the caBundle's CA"),
            Problem::Expired(Some(at)) => match Timestamp::from_second(*at as i64) {
                Ok(t) => write!(f, "expired at {t}"),
                Err(_) => f.write_str("has expired"),
            },
            Problem::Expired(None) => f.write_str("has expired"),
            Problem::NotYetValid => f.write_str("is not valid yet"),
            Problem::WrongName(name) => write!(f, "is not valid for {name}"),
            Problem::Other(why) => write!(f, "is refused: {why}"),
        }
    }
}

impl Problem {
    /// What to do about it in `install`.
    pub(super) fn fix(&self, install: &Install) -> String {
        let restart = format!(
            "kubectl -n {} rollout restart deployment/{}",
            install.namespace, install.controller
        );
        match self {
            Problem::UnknownIssuer => format!(
                "the caBundle and the controller's certificate disagree: the controller re-patches the caBundle every minute ({}); if it persists, {restart}",
                install.logs()
            ),
            Problem::Expired(_) | Problem::NotYetValid => format!(
                "renew it: delete the Secret it is kept in (kubectl -n {} get secrets) so the controller makes a new one, then {restart}; with cert-manager, kubectl -n {} describe certificate",
                install.namespace, install.namespace
            ),
            Problem::WrongName(name) => format!(
                "the controller's certificate must name {name} (the chart passes it as --tls-san): reinstall with the chart, or delete its Secret and {restart}"
            ),
            Problem::Unreadable(_) | Problem::Other(_) => format!("see {}", install.logs()),
        }
    }
}

/// How many PEM certificates `pem` holds.
pub(super) fn count(pem: &[u8]) -> usize {
    CertificateDer::pem_slice_iter(pem)
        .filter(Result::is_ok)
        .count()
}

/// Whether `chain_pem` (end entity first) is valid for `server_name` at
/// `now` under the CAs of `ca_bundle`.
pub(super) fn verify(
    chain_pem: &str,
    ca_bundle: &[u8],
    server_name: &str,
    now: UnixTime,
) -> Result<(), Problem> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| Problem::Unreadable(format!("the served chain: {e}")))?;
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or_else(|| Problem::Unreadable("no certificate served".into()))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_bundle) {
        let ca = ca.map_err(|e| Problem::Unreadable(format!("the caBundle: {e}")))?;
        roots
            .add(ca)
            .map_err(|e| Problem::Unreadable(format!("the caBundle: {e}")))?;
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| Problem::Unreadable(format!("the caBundle: {e}")))?;
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|e| Problem::Other(format!("{server_name}: {e}")))?;
    match verifier.verify_server_cert(leaf, intermediates, &name, &[], now) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InvalidCertificate(e)) => Err(match e {
            // A CA regenerated under the same name is found as the issuer
            // by name, and then its signature does not verify.
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                Problem::UnknownIssuer
            }
            CertificateError::Expired => Problem::Expired(None),
            CertificateError::ExpiredContext { not_after, .. } => {
                Problem::Expired(Some(not_after.as_secs()))
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                Problem::NotYetValid
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                Problem::WrongName(server_name.into())
            }
            other => Problem::Other(format!("{other:?}")),
        }),
        Err(e) => Err(Problem::Other(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::tls::generate;

    const NAME: &str = "reprise-controller.reprise-system.svc";

    #[test]
    fn a_chain_from_the_bundles_ca_for_the_services_name_passes() {
        let m = generate(&[NAME.into()]).expect("material");
        assert_eq!(count(m.ca_pem.as_bytes()), 1);
        assert_eq!(
            verify(&m.cert_pem, m.ca_pem.as_bytes(), NAME, UnixTime::now()),
            Ok(())
        );
    }

    #[test]
    fn another_ca_another_name_or_another_time_fail_each_with_its_problem() {
        let m = generate(&[NAME.into()]).expect("material");
        let other = generate(&[NAME.into()]).expect("material");
        assert_eq!(
            verify(&m.cert_pem, other.ca_pem.as_bytes(), NAME, UnixTime::now()),
            Err(Problem::UnknownIssuer)
        );
        assert_eq!(
            verify(
                &m.cert_pem,
                m.ca_pem.as_bytes(),
                "reprise-controller.elsewhere.svc",
                UnixTime::now()
            ),
            Err(Problem::WrongName(
                "reprise-controller.elsewhere.svc".into()
            ))
        );
        // rcgen's certificates are valid from 1975 to 4096.
        let past = UnixTime::since_unix_epoch(Duration::from_secs(86_400));
        assert_eq!(
            verify(&m.cert_pem, m.ca_pem.as_bytes(), NAME, past),
            Err(Problem::NotYetValid)
        );
        let far = UnixTime::since_unix_epoch(Duration::from_secs(2_200 * 365 * 86_400));
        assert!(
            matches!(
                verify(&m.cert_pem, m.ca_pem.as_bytes(), NAME, far),
                Err(Problem::Expired(_))
            ),
            "after notAfter"
        );
        assert!(matches!(
            verify("not pem", m.ca_pem.as_bytes(), NAME, UnixTime::now()),
            Err(Problem::Unreadable(_))
        ));
        assert_eq!(count(b"garbage"), 0);
    }

    #[test]
    fn each_problem_names_its_fix() {
        let install = Install::defaults(None);
        assert!(Problem::UnknownIssuer
            .fix(&install)
            .contains("kubectl -n reprise-system logs deployment/reprise-controller"));
        assert!(Problem::Expired(Some(0))
            .fix(&install)
            .contains("rollout restart deployment/reprise-controller"));
        assert_eq!(
            Problem::Expired(Some(0)).to_string(),
            "expired at 1970-01-01T00:00:00Z"
        );
        assert!(Problem::WrongName(NAME.into()).fix(&install).contains(NAME));
    }
}
