//! The generated serving certificate, renewed before it expires: it is
//! valid [`SERVING_DAYS`], and from [`RENEW_BEFORE_DAYS`] before its end a
//! replica signs a new one under the same CA (whose key the controller
//! keeps with it), stores it where the material lives (its Secret, or the
//! directory), and every replica serves the stored one from its next check
//! on, without a restart. The CA is valid [`CA_DAYS`]: sidecars and the
//! webhook configuration trust it, so it does not change with a renewal.
//!
//! Material the controller did not generate (cert-manager's) is renewed by
//! whoever made it; the controller serves what it finds there. Material
//! generated before the CA key was kept cannot be renewed under its CA: its
//! certificate was made to last until the year 4096.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rcgen::{CertificateParams, DnType, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::{certified_key, TlsMaterial};
use crate::Error;

/// Days a generated serving certificate is valid.
pub const SERVING_DAYS: i64 = 365;
/// Days a generated CA is valid.
pub const CA_DAYS: i64 = 3650;
/// Days before its end a serving certificate is renewed.
pub const RENEW_BEFORE_DAYS: i64 = 30;
/// How often each replica looks at the stored material.
const CHECK_EVERY: Duration = Duration::from_secs(6 * 3600);

/// Sets `params`' validity: from yesterday to `days` from today (UTC
/// dates: a clock a little behind still accepts it from the start).
pub(super) fn set_validity(params: &mut CertificateParams, days: i64) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let date = |offset_days: i64| {
        let t = now
            .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(
                offset_days * 24,
            ))
            .unwrap_or(now);
        let d = t.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC).date();
        rcgen::date_time_ymd(
            i32::from(d.year()),
            u8::try_from(d.month()).unwrap_or(1),
            u8::try_from(d.day()).unwrap_or(1),
        )
    };
    params.not_before = date(-1);
    params.not_after = date(days);
}

/// A serving certificate for `sans`, valid `days`, issued by `issuer`: its
/// PEM and its key's.
pub(super) fn serving(
    issuer: &Issuer<'_, KeyPair>,
    sans: &[String],
    days: i64,
) -> Result<(String, String), Error> {
    let key = KeyPair::generate().map_err(Error::Certificate)?;
    let mut params = CertificateParams::new(sans.to_vec()).map_err(Error::Certificate)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "reprise-controller");
    set_validity(&mut params, days);
    let cert = params.signed_by(&key, issuer).map_err(Error::Certificate)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Whether `material`'s serving certificate will have expired `days` from
/// now (or has); `None` when it cannot be read against its CA.
pub fn expires_within(material: &TlsMaterial, days: i64) -> Option<bool> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(material.ca_pem.as_bytes()) {
        roots.add(ca.ok()?).ok()?;
    }
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(material.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .ok()?;
    let (leaf, intermediates) = chain.split_first()?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .ok()?;
    let then = UnixTime::since_unix_epoch(Duration::from_secs(
        u64::try_from(k8s_openapi::jiff::Timestamp::now().as_second() + days * 86_400).ok()?,
    ));
    // Any name: an expired certificate fails on its dates before its names.
    let name = ServerName::try_from("localhost").ok()?;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::CertificateError as E;
    match verifier.verify_server_cert(leaf, intermediates, &name, &[], then) {
        Ok(_) => Some(false),
        Err(rustls::Error::InvalidCertificate(E::Expired | E::ExpiredContext { .. })) => Some(true),
        Err(rustls::Error::InvalidCertificate(
            E::NotValidForName | E::NotValidForNameContext { .. },
        )) => Some(false),
        Err(_) => None,
    }
}

/// `material` with a new serving certificate for `sans`, valid
/// [`SERVING_DAYS`], under the same CA (`None` without the CA's key).
pub fn renewed(material: &TlsMaterial, sans: &[String]) -> Result<Option<TlsMaterial>, Error> {
    let Some(ca_key) = &material.ca_key_pem else {
        return Ok(None);
    };
    let ca_key = KeyPair::from_pem(ca_key).map_err(Error::Certificate)?;
    // The issuer as the CA was made: the same name, key and usages, so the
    // new certificate chains to the CA every sidecar trusts.
    let issuer = Issuer::new(super::ca_params(), ca_key);
    let (cert_pem, key_pem) = serving(&issuer, sans, SERVING_DAYS)?;
    Ok(Some(TlsMaterial {
        cert_pem,
        key_pem,
        ..material.clone()
    }))
}

/// The serving certificate the listeners present, swapped in place when a
/// renewed one is stored.
#[derive(Debug)]
pub struct Reloadable {
    current: RwLock<(String, Arc<rustls::sign::CertifiedKey>)>,
}

impl Reloadable {
    pub(super) fn new(material: &TlsMaterial) -> Result<Self, Error> {
        Ok(Reloadable {
            current: RwLock::new((
                material.cert_pem.clone(),
                Arc::new(certified_key(material)?),
            )),
        })
    }

    /// Serves `material` from the next handshake on (when it differs).
    pub fn swap(&self, material: &TlsMaterial) -> Result<bool, Error> {
        if self.serving_pem() == material.cert_pem {
            return Ok(false);
        }
        let key = Arc::new(certified_key(material)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (material.cert_pem.clone(), key);
        Ok(true)
    }

    /// The serving certificate (PEM) presented now.
    pub fn serving_pem(&self) -> String {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }
}

impl rustls::server::ResolvesServerCert for Reloadable {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|e| e.into_inner()).1,
        ))
    }
}

/// Where the material is kept.
#[derive(Clone)]
pub(crate) enum Store {
    /// `ca.crt`, `ca.key`, `tls.crt`, `tls.key` in this directory.
    Dir(PathBuf),
    /// This Secret, shared by every replica.
    Secret {
        /// A client allowed to get and update it.
        client: kube::Client,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Dir(dir) => f.debug_tuple("Dir").field(dir).finish(),
            Store::Secret {
                namespace, name, ..
            } => write!(f, "Secret({namespace}/{name})"),
        }
    }
}

/// Every [`CHECK_EVERY`]: reads the stored material, renews its serving
/// certificate when it expires within [`RENEW_BEFORE_DAYS`] (and its CA's
/// key is there), and has `serving` present what is stored. Runs forever.
pub(crate) async fn keep_renewed(store: Store, sans: Vec<String>, serving: Arc<Reloadable>) {
    loop {
        if let Err(e) = check(&store, &sans, &serving).await {
            tracing::warn!(error = %e, "cannot check the serving certificate; trying again later");
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

async fn check(store: &Store, sans: &[String], serving: &Reloadable) -> Result<(), Error> {
    let (mut material, version) = load(store).await?;
    if expires_within(&material, RENEW_BEFORE_DAYS) == Some(true) {
        match renewed(&material, sans)? {
            Some(new) => {
                if save(store, &new, version).await? {
                    tracing::info!(
                        days = SERVING_DAYS,
                        "renewed the serving certificate under the same CA"
                    );
                    material = new;
                } else {
                    // Another replica renewed it first: serve theirs.
                    material = load(store).await?.0;
                }
            }
            None => tracing::warn!(
                "the serving certificate expires within {RENEW_BEFORE_DAYS} days and its CA's key is not kept: renew it where it comes from"
            ),
        }
    }
    if serving.swap(&material)? {
        tracing::info!("serving the renewed certificate");
    }
    Ok(())
}

/// The stored material, and the Secret's resource version.
async fn load(store: &Store) -> Result<(TlsMaterial, Option<String>), Error> {
    match store {
        Store::Dir(dir) => Ok((super::load_or_generate(dir, &[])?, None)),
        Store::Secret {
            client,
            namespace,
            name,
        } => {
            use k8s_openapi::api::core::v1::Secret;
            let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
            let secret = api.get(name).await.map_err(Error::Kube)?;
            let version = secret.metadata.resource_version.clone();
            Ok((super::from_secret(&secret)?, version))
        }
    }
}

/// Stores `material`; false when the Secret changed since `version` was
/// read (another replica renewed it).
async fn save(
    store: &Store,
    material: &TlsMaterial,
    version: Option<String>,
) -> Result<bool, Error> {
    match store {
        Store::Dir(dir) => {
            super::write(&dir.join("tls.key"), &material.key_pem, 0o600)?;
            super::write(&dir.join("tls.crt"), &material.cert_pem, 0o644)?;
            Ok(true)
        }
        Store::Secret {
            client,
            namespace,
            name,
        } => {
            use k8s_openapi::api::core::v1::Secret;
            let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
            let mut secret = api.get(name).await.map_err(Error::Kube)?;
            if secret.metadata.resource_version != version {
                return Ok(false);
            }
            secret.data = None;
            secret.string_data = Some(super::material_data(material));
            match api
                .replace(name, &kube::api::PostParams::default(), &secret)
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(Error::Kube(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sans() -> Vec<String> {
        vec!["localhost".to_string()]
    }

    #[test]
    fn a_generated_certificate_lasts_a_year_and_its_ca_ten() {
        let m = super::super::generate(&sans()).expect("generated");
        assert_eq!(expires_within(&m, 0), Some(false));
        assert_eq!(expires_within(&m, SERVING_DAYS - 2), Some(false));
        assert_eq!(
            expires_within(&m, SERVING_DAYS + 2),
            Some(true),
            "not for ever"
        );
        assert!(m.ca_key_pem.is_some(), "the CA's key is kept to renew");
    }

    #[test]
    fn a_certificate_near_its_end_is_renewed_under_the_same_ca() {
        let mut m = super::super::generate(&sans()).expect("generated");
        // A serving certificate with ten days left.
        let ca_key = KeyPair::from_pem(m.ca_key_pem.as_deref().expect("key")).expect("key");
        let issuer = Issuer::new(super::super::ca_params(), ca_key);
        let (cert, key) = serving(&issuer, &sans(), 10).expect("short");
        m.cert_pem = cert;
        m.key_pem = key;
        assert_eq!(expires_within(&m, RENEW_BEFORE_DAYS), Some(true));
        let fresh = renewed(&m, &sans()).expect("signs").expect("a CA key");
        assert_eq!(fresh.ca_pem, m.ca_pem, "the same CA");
        assert_ne!(fresh.cert_pem, m.cert_pem);
        assert_eq!(
            expires_within(&fresh, RENEW_BEFORE_DAYS),
            Some(false),
            "the renewed certificate chains to the CA and has a year ahead"
        );
        // The listeners serve it from the next handshake on.
        let serving = Reloadable::new(&m).expect("served");
        assert!(serving.swap(&fresh).expect("swapped"));
        assert_eq!(serving.serving_pem(), fresh.cert_pem);
        assert!(!serving.swap(&fresh).expect("the same"), "nothing to swap");
        // Without the CA's key there is nothing to renew with.
        let foreign = TlsMaterial {
            ca_key_pem: None,
            ..m
        };
        assert!(renewed(&foreign, &sans()).expect("no error").is_none());
    }
}
