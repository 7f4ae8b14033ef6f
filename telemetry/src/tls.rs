//! TLS to the collector for an `https://` endpoint: the rustls client
//! configuration read from the files the `OTEL_*` variables name, and the
//! connector both transports dial with (the tonic channel of OTLP/gRPC, the
//! hyper client of OTLP/HTTP).
//!
//! The contract: verification is always on. The collector's certificate is
//! checked against `…_CERTIFICATE` when it is set (the bundle replaces the
//! public roots: a private CA's collector is trusted for what that CA signs
//! and nothing else), otherwise against Mozilla's roots compiled in
//! (`webpki-roots`), so that trust does not depend on what the image carries.
//! The files are read once, when the pipeline starts, and every rule one
//! breaks is an [`Error::File`] naming its variable: a bundle holds at least
//! one usable certificate, a client chain at least one, and the key matches
//! the chain's leaf. rustls with ring, the crypto provider of the whole
//! workspace.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::settings::{FileVar, TlsSettings};
use crate::Error;

/// The largest PEM file read (a bundle of every public root is ~250 KiB).
const MAX_PEM_BYTES: u64 = 1 << 20;

/// The client configuration `tls` describes, offering `alpn` (`h2` for
/// gRPC, `http/1.1` for OTLP/HTTP: hyper's client here speaks HTTP/1.1).
pub(crate) fn client_config(tls: &TlsSettings, alpn: &[u8]) -> Result<Arc<ClientConfig>, Error> {
    let roots = match &tls.ca {
        Some(ca) => {
            let mut store = RootCertStore::empty();
            for (i, cert) in read_certs(ca)?.into_iter().enumerate() {
                store.add(cert).map_err(|e| {
                    refuse(
                        ca,
                        format!("certificate {} is not a usable root", i + 1),
                        Some(e.into()),
                    )
                })?;
            }
            store
        }
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls { source: e })?
        .with_root_certificates(roots);
    let mut config = match &tls.client {
        Some(client) => {
            let chain = read_certs(&client.cert)?;
            let bytes = read_file(&client.key)?;
            let key = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
                refuse(
                    &client.key,
                    "must hold a PEM private key (PKCS#8, PKCS#1 or SEC1)".into(),
                    Some(e.into()),
                )
            })?;
            // Checked now: a key of another certificate would otherwise
            // surface as handshakes the collector refuses, one per export.
            let key = CertifiedKey::from_der(chain, key, &provider).map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => refuse(
                    &client.key,
                    format!(
                        "does not match the certificate in {}={}",
                        client.cert.var,
                        client.cert.path.display()
                    ),
                    Some(e.into()),
                ),
                other => refuse(
                    &client.key,
                    "is not a usable private key".into(),
                    Some(other.into()),
                ),
            })?;
            builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(key)))
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// The certificates of the PEM file `file` names, at least one.
fn read_certs(file: &FileVar) -> Result<Vec<CertificateDer<'static>>, Error> {
    let bytes = read_file(file)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| refuse(file, "must be PEM".into(), Some(e.into())))?;
    if certs.is_empty() {
        return Err(refuse(
            file,
            "must hold at least one PEM certificate (-----BEGIN CERTIFICATE-----); it has none"
                .into(),
            None,
        ));
    }
    Ok(certs)
}

/// The bytes of the small PEM file `file` names: a regular file (a FIFO
/// would block the start) of at most [`MAX_PEM_BYTES`].
fn read_file(file: &FileVar) -> Result<Vec<u8>, Error> {
    let path: &Path = &file.path;
    let unreadable = |e: io::Error| refuse(file, "cannot be read".into(), Some(e.into()));
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_file() {
        return Err(refuse(file, "must be a regular file".into(), None));
    }
    if meta.len() > MAX_PEM_BYTES {
        return Err(refuse(
            file,
            format!(
                "must be at most {MAX_PEM_BYTES} bytes; it has {}",
                meta.len()
            ),
            None,
        ));
    }
    std::fs::read(path).map_err(unreadable)
}

fn refuse(
    file: &FileVar,
    reason: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    Error::File {
        var: file.var,
        path: file.path.clone(),
        reason,
        source,
    }
}

/// Dials TCP to a URI's host and port (443 when it names none) and shakes
/// hands, verifying the host's name. The connector of the tonic channel and
/// of the OTLP/HTTP client: neither has TLS of its own here. It connects
/// directly, never through `HTTP_PROXY`, which in a pod can point back at the
/// sidecar.
#[derive(Clone, Debug)]
pub(crate) struct TlsConnector {
    config: Arc<ClientConfig>,
}

impl TlsConnector {
    /// Shakes hands with `config`.
    pub(crate) fn new(config: Arc<ClientConfig>) -> Self {
        TlsConnector { config }
    }
}

impl tower_service::Service<Uri> for TlsConnector {
    type Response = TlsIo;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsIo>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let config = Arc::clone(&self.config);
        Box::pin(async move {
            let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
            // An IPv6 literal comes bracketed; the name to verify and to dial is without.
            let host = uri
                .host()
                .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string())
                .filter(|h| !h.is_empty())
                .ok_or_else(|| invalid(format!("{uri}: no host")))?;
            let port = uri.port_u16().unwrap_or(443);
            let name = ServerName::try_from(host.clone())
                .map_err(|e| invalid(format!("{host}: not a DNS name or IP address ({e})")))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            // Exports are small writes waiting for an answer: no Nagle delay.
            let _ = tcp.set_nodelay(true);
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TlsIo(TokioIo::new(tls)))
        })
    }
}

/// A TLS connection as hyper's I/O traits want it.
#[derive(Debug)]
pub(crate) struct TlsIo(TokioIo<TlsStream<TcpStream>>);

impl hyper::rt::Read for TlsIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for TlsIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }
}

impl Connection for TlsIo {
    fn connected(&self) -> Connected {
        let connected = Connected::new();
        if self.0.inner().get_ref().1.alpn_protocol() == Some(b"h2") {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use reprise_testkit::tls::TestCa;

    use super::*;
    use crate::settings::ClientFiles;

    fn file(var: &'static str, path: impl Into<PathBuf>) -> FileVar {
        FileVar {
            var,
            path: path.into(),
        }
    }

    const CA: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
    const CERT: &str = "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE";
    const KEY: &str = "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY";

    #[test]
    fn a_bundle_and_a_matching_client_identity_make_a_config() {
        let ca = TestCa::new("otlp-config");
        let client = ca.issue("client", &["reprise"]);
        let config = client_config(
            &TlsSettings {
                ca: Some(file(CA, ca.ca_file())),
                client: Some(ClientFiles {
                    cert: file(CERT, &client.cert_file),
                    key: file(KEY, &client.key_file),
                }),
            },
            b"h2",
        )
        .expect("usable");
        assert_eq!(config.alpn_protocols, [b"h2".to_vec()]);
        assert!(config.client_auth_cert_resolver.has_certs());
        let public = client_config(
            &TlsSettings {
                ca: None,
                client: None,
            },
            b"http/1.1",
        )
        .expect("the public roots");
        assert!(!public.client_auth_cert_resolver.has_certs());
    }

    #[test]
    fn unusable_files_are_refused_naming_the_variable_and_the_rule() {
        let ca = TestCa::new("otlp-refusals");
        let client = ca.issue("client", &["reprise"]);
        let other = ca.issue("other", &["reprise"]);
        let dir = ca.dir().to_path_buf();
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "not PEM at all\n").expect("write");
        let missing = dir.join("missing.pem");
        let identity = |cert: &Path, key: &Path| {
            Some(ClientFiles {
                cert: file(CERT, cert),
                key: file(KEY, key),
            })
        };
        // (settings, the variable named, words of the rule)
        let table: Vec<(TlsSettings, &str, &str)> = vec![
            (
                TlsSettings {
                    ca: Some(file(CA, &missing)),
                    client: None,
                },
                CA,
                "cannot be read",
            ),
            (
                TlsSettings {
                    ca: Some(file(CA, &dir)),
                    client: None,
                },
                CA,
                "must be a regular file",
            ),
            (
                TlsSettings {
                    ca: Some(file(CA, &garbage)),
                    client: None,
                },
                CA,
                "at least one PEM certificate",
            ),
            // A key where the bundle should be: PEM, but no certificate.
            (
                TlsSettings {
                    ca: Some(file(CA, &client.key_file)),
                    client: None,
                },
                CA,
                "at least one PEM certificate",
            ),
            (
                TlsSettings {
                    ca: None,
                    client: identity(&missing, &client.key_file),
                },
                CERT,
                "cannot be read",
            ),
            (
                TlsSettings {
                    ca: None,
                    client: identity(&client.key_file, &client.key_file),
                },
                CERT,
                "at least one PEM certificate",
            ),
            (
                TlsSettings {
                    ca: None,
                    client: identity(&client.cert_file, &client.cert_file),
                },
                KEY,
                "must hold a PEM private key",
            ),
            (
                TlsSettings {
                    ca: None,
                    client: identity(&client.cert_file, &other.key_file),
                },
                KEY,
                "does not match the certificate in OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE=",
            ),
        ];
        for (settings, var, rule) in table {
            let err = client_config(&settings, b"h2").expect_err("refused");
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("{var}=")) && text.contains(rule),
                "{settings:?}: {text}"
            );
        }
        // The reader's error is the source, for the log.
        let err = client_config(
            &TlsSettings {
                ca: Some(file(CA, &missing)),
                client: None,
            },
            b"h2",
        )
        .expect_err("missing");
        let source = std::error::Error::source(&err).expect("a source");
        assert!(source.to_string().contains("No such file"), "{source}");
    }
}
