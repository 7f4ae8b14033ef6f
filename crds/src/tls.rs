//! The TLS material an upstream's `tls` block names, read from PEM files
//! and checked where the rest of the configuration is checked (`--check`,
//! the start, every reload), so that a bad file is refused naming its field
//! and never half-applied: a trust bundle must hold a certificate, a client
//! certificate must come with the private key that matches it.
//!
//! A private key never leaves [`ClientIdentity`] in a form that prints: its
//! `Debug` names the files, and the configuration's serialisation (what the
//! admin endpoint's `/config` shows) carries the paths only.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use serde::Serialize;

/// Root certificates read from a PEM bundle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TrustBundle {
    /// The bundle's file (empty when it came with a snapshot).
    pub file: PathBuf,
    /// Its certificates, in file order.
    #[serde(skip)]
    pub certs: Vec<CertificateDer<'static>>,
}

/// A client certificate chain and the private key that matches its leaf.
#[derive(Clone, Serialize)]
pub struct ClientIdentity {
    /// The chain's file, leaf first.
    pub cert_file: PathBuf,
    /// The key's file.
    pub key_file: PathBuf,
    /// The chain with its signing key, checked to match.
    #[serde(skip)]
    pub key: Arc<CertifiedKey>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ClientIdentity {
    fn eq(&self, other: &Self) -> bool {
        self.cert_file == other.cert_file
            && self.key_file == other.key_file
            && self.key.cert == other.key.cert
    }
}

impl Eq for ClientIdentity {}

/// The largest PEM file or text read (a bundle of every public root is
/// about 250 KiB).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// The certificates of the PEM bundle `file`; the error is the rule it
/// broke, for its field.
pub fn read_bundle(file: &Path) -> Result<TrustBundle, String> {
    let certs = read_anchors(file)?;
    Ok(TrustBundle {
        file: file.to_path_buf(),
        certs,
    })
}

/// The certificate chain in `cert_file` with the private key in
/// `key_file`; the error names which of the two fields broke which rule.
pub fn read_identity(
    cert_file: &Path,
    key_file: &Path,
) -> Result<ClientIdentity, (IdentityField, String)> {
    let chain = read_certs(cert_file).map_err(|rule| (IdentityField::Cert, rule))?;
    let bytes = read_file(key_file).map_err(|rule| (IdentityField::Key, rule))?;
    let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        (
            IdentityField::Key,
            format!(
                "must hold a PEM private key (PKCS#8, PKCS#1 or SEC1) ({}: {e})",
                key_file.display()
            ),
        )
    })?;
    let provider = rustls::crypto::ring::default_provider();
    let key = CertifiedKey::from_der(chain, key, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => (
            IdentityField::Key,
            format!(
                "does not match the certificate in {} ({})",
                cert_file.display(),
                key_file.display()
            ),
        ),
        other => (
            IdentityField::Key,
            format!(
                "is not a usable private key ({}: {other})",
                key_file.display()
            ),
        ),
    })?;
    Ok(ClientIdentity {
        cert_file: cert_file.to_path_buf(),
        key_file: key_file.to_path_buf(),
        key: Arc::new(key),
    })
}

/// Which file of a client identity broke a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentityField {
    /// The certificate chain (`client_cert_file`).
    Cert,
    /// The private key (`client_key_file`).
    Key,
}

/// The trust bundle in `pem`, text that came with a snapshot (a
/// BackendTLSPolicy's CA certificates) rather than from a file; `origin`
/// names it in the error.
pub fn parse_bundle(pem: &[u8], origin: &str) -> Result<TrustBundle, String> {
    if pem.len() as u64 > MAX_PEM_BYTES {
        return Err(format!(
            "must be at most {MAX_PEM_BYTES} bytes ({origin} has {})",
            pem.len()
        ));
    }
    Ok(TrustBundle {
        file: PathBuf::new(),
        certs: anchors(pem, origin)?,
    })
}

/// The certificates of the PEM bundle `file`, each one a usable trust
/// anchor.
fn read_anchors(file: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    anchors(&read_file(file)?, &file.display().to_string())
}

/// The certificates of the PEM bundle `pem` (from `origin`), each one a
/// usable trust anchor.
fn anchors(pem: &[u8], origin: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = certs(pem, origin)?;
    let mut store = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        store.add(cert.clone()).map_err(|e| {
            format!(
                "certificate {} of {origin} is not a usable root ({e})",
                i + 1
            )
        })?;
    }
    Ok(certs)
}

/// The certificates of the PEM file `file`, at least one.
fn read_certs(file: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    certs(&read_file(file)?, &file.display().to_string())
}

/// The certificates in `pem` (from `origin`), at least one.
fn certs(pem: &[u8], origin: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("must be PEM ({origin}: {e})"))?;
    if certs.is_empty() {
        return Err(format!(
            "must hold at least one PEM certificate ({origin} has none)"
        ));
    }
    Ok(certs)
}

/// The bytes of a small PEM file (a bundle, a chain, a key): at most 1 MiB,
/// and a regular file (a FIFO would block the read).
fn read_file(file: &Path) -> Result<Vec<u8>, String> {
    let meta =
        std::fs::metadata(file).map_err(|e| format!("cannot be read ({}: {e})", file.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "must be a regular file ({} is not)",
            file.display()
        ));
    }
    if meta.len() > MAX_PEM_BYTES {
        return Err(format!(
            "must be at most {MAX_PEM_BYTES} bytes ({} has {})",
            file.display(),
            meta.len()
        ));
    }
    std::fs::read(file).map_err(|e| format!("cannot be read ({}: {e})", file.display()))
}

#[cfg(test)]
mod tests;
