//! TLS for both controller listeners (the push stream and the injection
//! webhook): the serving certificate and its CA, loaded from a directory or a
//! Secret or generated on first start (`docs/src/concepts/controller.md`), the rustls
//! configuration, and the accept loop. A generated serving certificate is
//! valid a year and renewed under the same CA before it expires
//! (`tls/renew.rs`), which the listeners serve without a restart.

mod renew;

pub use renew::{expires_within, renewed, Reloadable, CA_DAYS, RENEW_BEFORE_DAYS, SERVING_DAYS};
pub(crate) use renew::{keep_renewed, Store};

use std::path::Path;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::listen::{Closed, Gate, Watched};
use crate::Error;

/// PEM material for the push server.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The CA sidecars trust.
    pub ca_pem: String,
    /// Serving certificate.
    pub cert_pem: String,
    /// Serving key.
    pub key_pem: String,
    /// The CA's key, kept to renew the serving certificate under the same
    /// CA; `None` for material from elsewhere (cert-manager) or generated
    /// before the controller kept it.
    pub ca_key_pem: Option<String>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("TlsMaterial").finish_non_exhaustive()
    }
}

/// Reads `ca.crt`, `tls.crt`, `tls.key` from `dir`, generating all three when absent.
pub(crate) fn load_or_generate(dir: &Path, sans: &[String]) -> Result<TlsMaterial, Error> {
    let (ca, cert, key) = (dir.join("ca.crt"), dir.join("tls.crt"), dir.join("tls.key"));
    let ca_key = dir.join("ca.key");
    if cert.exists() && key.exists() {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| Error::TlsFile {
                path: p.to_path_buf(),
                source,
            })
        };
        return Ok(TlsMaterial {
            ca_pem: if ca.exists() {
                read(&ca)?
            } else {
                String::new()
            },
            cert_pem: read(&cert)?,
            key_pem: read(&key)?,
            ca_key_pem: ca_key.exists().then(|| read(&ca_key)).transpose()?,
        });
    }
    let material = generate(sans)?;
    std::fs::create_dir_all(dir).map_err(|source| Error::TlsFile {
        path: dir.to_path_buf(),
        source,
    })?;
    write(&ca, &material.ca_pem, 0o644)?;
    write(&cert, &material.cert_pem, 0o644)?;
    write(&key, &material.key_pem, 0o600)?;
    if let Some(pem) = &material.ca_key_pem {
        write(&ca_key, pem, 0o600)?;
    }
    Ok(material)
}

/// Reads the CA and serving certificate from the Secret `name`, creating it
/// with generated material when it does not exist. Every replica calls this
/// at start; whichever creates the Secret first wins and the others read it,
/// so all replicas serve the same certificate under the same CA.
pub(crate) async fn load_or_create_secret(
    client: kube::Client,
    namespace: &str,
    name: &str,
    sans: &[String],
) -> Result<TlsMaterial, Error> {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};
    let api: Api<Secret> = Api::namespaced(client, namespace);
    for _ in 0..3 {
        if let Some(secret) = api.get_opt(name).await.map_err(Error::Kube)? {
            return from_secret(&secret);
        }
        let material = generate(sans)?;
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                labels: Some(
                    [(
                        "app.kubernetes.io/part-of".to_string(),
                        "reprise".to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            string_data: Some(material_data(&material)),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(%namespace, %name, "generated the CA and serving certificate");
                return Ok(material);
            }
            // Another replica created it between our get and create: read theirs.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(Error::Kube(e)),
        }
    }
    Err(Error::SecretRace {
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// The Secret's `stringData` for `material`.
fn material_data(material: &TlsMaterial) -> std::collections::BTreeMap<String, String> {
    let mut data: std::collections::BTreeMap<String, String> = [
        ("ca.crt".to_string(), material.ca_pem.clone()),
        ("tls.crt".to_string(), material.cert_pem.clone()),
        ("tls.key".to_string(), material.key_pem.clone()),
    ]
    .into();
    if let Some(pem) = &material.ca_key_pem {
        data.insert("ca.key".to_string(), pem.clone());
    }
    data
}

fn from_secret(secret: &k8s_openapi::api::core::v1::Secret) -> Result<TlsMaterial, Error> {
    let data = secret.data.as_ref();
    let field = |key: &'static str| {
        data.and_then(|d| d.get(key))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or(Error::SecretField { key })
    };
    Ok(TlsMaterial {
        ca_pem: field("ca.crt")?,
        cert_pem: field("tls.crt")?,
        key_pem: field("tls.key")?,
        ca_key_pem: field("ca.key").ok(),
    })
}

/// A new private CA (valid [`CA_DAYS`]) and a serving certificate for
/// `sans` (valid [`SERVING_DAYS`]).
pub fn generate(sans: &[String]) -> Result<TlsMaterial, Error> {
    let ca_key = KeyPair::generate().map_err(Error::Certificate)?;
    let mut ca_params = ca_params();
    renew::set_validity(&mut ca_params, CA_DAYS);
    let ca_cert = ca_params.self_signed(&ca_key).map_err(Error::Certificate)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let (cert_pem, key_pem) = renew::serving(&issuer, sans, SERVING_DAYS)?;
    Ok(TlsMaterial {
        ca_pem: ca_cert.pem(),
        cert_pem,
        key_pem,
        ca_key_pem: Some(ca_key_pem),
    })
}

/// The CA's parameters (its name and usages, which a renewal signs under
/// again; its validity is set where it is made).
fn ca_params() -> CertificateParams {
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "reprise push CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params
}

/// A rustls server configuration (h2 and http/1.1) from the material.
pub fn server_config(material: &TlsMaterial) -> Result<Arc<rustls::ServerConfig>, Error> {
    Ok(server_config_reloadable(material)?.0)
}

/// [`server_config`], and what swaps its certificate for a renewed one
/// while it serves.
pub fn server_config_reloadable(
    material: &TlsMaterial,
) -> Result<(Arc<rustls::ServerConfig>, Arc<Reloadable>), Error> {
    let reloadable = Arc::new(Reloadable::new(material)?);
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(Error::Tls)?
    .with_no_client_auth()
    .with_cert_resolver(Arc::clone(&reloadable) as Arc<dyn rustls::server::ResolvesServerCert>);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(config), reloadable))
}

/// The serving chain and key of `material`, as rustls serves them.
fn certified_key(material: &TlsMaterial) -> Result<rustls::sign::CertifiedKey, Error> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(material.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|source| Error::Pem {
                what: "serving certificate",
                source,
            })?;
    let key = PrivateKeyDer::from_pem_slice(material.key_pem.as_bytes()).map_err(|source| {
        Error::Pem {
            what: "serving key",
            source,
        }
    })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(Error::Tls)?;
    let certified = rustls::sign::CertifiedKey::new(certs, signing);
    certified.keys_match().map_err(Error::Tls)?;
    Ok(certified)
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |source| Error::TlsFile {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(failed)?;
    f.write_all(text.as_bytes()).map_err(failed)
}

/// The TLS accept loop both controller listeners share: accepts on
/// `listener` until `shutdown` resolves, within `gate`'s caps (a connection
/// over one is closed at once), completes each handshake within its header
/// timeout on the connection's own task, so a slow client never holds up
/// the loop, and hands the stream, cut when it stalls, and the peer's
/// address to `serve`.
pub(crate) async fn accept<F, Fut>(
    listener: tokio::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
    shutdown: impl std::future::Future<Output = ()>,
    gate: Arc<Gate>,
    serve: F,
) where
    F: Fn(Conn, std::net::SocketAddr) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::pin!(shutdown);
    let what = gate.name;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(listener = what, error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let Some(slot) = gate.admit(peer) else {
            continue; // over a cap: closed here, counted by the gate
        };
        let stream = gate.watch(stream, slot);
        let (acceptor, serve, gate) = (acceptor.clone(), serve.clone(), Arc::clone(&gate));
        tokio::spawn(async move {
            let handshake = acceptor.accept(stream);
            match tokio::time::timeout(gate.limits.header_timeout, handshake).await {
                Ok(Ok(tls)) => serve(tls, peer).await,
                Ok(Err(e)) => {
                    tracing::debug!(listener = what, %peer, error = %e, "TLS handshake failed")
                }
                Err(_) => gate.count(Closed::HandshakeTimeout),
            }
        });
    }
}

/// A connection of a TLS listener, as `serve` gets it.
pub(crate) type Conn = tokio_rustls::server::TlsStream<Watched<tokio::net::TcpStream>>;
