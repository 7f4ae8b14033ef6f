//! TLS the sidecar originates towards an upstream's endpoints: one client
//! configuration per upstream (its trust, its client certificate, the ALPN
//! its protocol asks for), shared by every endpoint and every attempt, so
//! each attempt of a request presents the same policy and only the address
//! changes. Sessions are resumed from a store per endpoint (`sessions`).
//!
//! The contract with the retry engine: a certificate that fails validation
//! is `tls_certificate`, never retried; any other end of the handshake
//! before it completed (a reset, a close, an alert, a timeout, plain text,
//! no `h2` where HTTP/2 needs it) is `tls_handshake`, at the connect stage:
//! nothing was written, so it is retried like a refused connection.

mod expiry;
mod sessions;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use reprise_crds::config::{TrustAnchors, UpstreamTls};
use reprise_crds::Protocol;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{Resumption, WebPkiServerVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::SingleCertAndKey;
use rustls::DigitallySignedStruct;
use rustls::{ClientConfig, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::exchange::failure::{classify_tls_error, FailureKind, Stage};

/// How the sidecar opens TLS to one upstream's endpoints.
#[derive(Clone)]
pub(crate) struct TlsOrigin {
    /// The connector and the name to verify, or why rustls refused to make
    /// them: the configuration's checks accept only what rustls accepts, so
    /// that is a bug, and then every handshake fails (never plain text).
    ready: Result<Ready, Arc<str>>,
    /// What it offers in ALPN, from the protocol.
    protocol: Protocol,
    /// The endpoint must select HTTP/2 (`h2`).
    require_h2: bool,
    /// When each endpoint's certificate expires (seconds since the epoch),
    /// as its last handshake showed.
    expiries: Arc<Mutex<HashMap<SocketAddr, i64>>>,
}

#[derive(Clone)]
struct Ready {
    /// The upstream's configuration; each endpoint's connector is this with
    /// the ALPN offered and the endpoint's own session store.
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    /// Connectors made so far, by endpoint and protocol offered.
    connectors: Arc<Mutex<HashMap<(SocketAddr, Protocol), TlsConnector>>>,
    sessions: Arc<sessions::Sessions>,
}

impl Ready {
    /// The connector for `endpoint` offering `protocol`, made on first use.
    fn connector(&self, endpoint: SocketAddr, protocol: Protocol) -> TlsConnector {
        let mut connectors = lock(&self.connectors);
        if let Some(c) = connectors.get(&(endpoint, protocol)) {
            return c.clone();
        }
        let mut config = ClientConfig::clone(&self.config);
        config.alpn_protocols = alpn(protocol);
        config.resumption = Resumption::store(self.sessions.of(endpoint));
        let connector = TlsConnector::from(Arc::new(config));
        if connectors.len() >= sessions::ENDPOINTS {
            connectors.clear();
        }
        connectors.insert((endpoint, protocol), connector.clone());
        connector
    }
}

impl std::fmt::Debug for TlsOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("TlsOrigin");
        match &self.ready {
            Ok(ready) => d.field("server_name", &ready.server_name),
            Err(why) => d.field("refused", why),
        };
        d.field("require_h2", &self.require_h2)
            .finish_non_exhaustive()
    }
}

impl TlsOrigin {
    /// The origin of `tls` for an upstream speaking `protocol`.
    pub(crate) fn new(tls: &UpstreamTls, protocol: Protocol) -> Self {
        let ready = Self::ready(tls).map_err(|e| {
            tracing::error!(server_name = %tls.server_name, error = %e, "TLS settings refused; every handshake will fail");
            Arc::from(e.to_string())
        });
        Self {
            ready,
            protocol,
            require_h2: protocol == Protocol::H2,
            expiries: Arc::default(),
        }
    }

    /// The same TLS offering `protocol` in ALPN instead (one trust, one
    /// client certificate, one session cache): `auto` dials with both
    /// protocols offered once, then with the one the endpoint chose.
    pub(crate) fn speaking(&self, protocol: Protocol) -> Self {
        Self {
            protocol,
            require_h2: protocol == Protocol::H2,
            ..self.clone()
        }
    }

    /// The connector and server name. The files were read and checked with
    /// the configuration; what can still fail is rustls refusing them.
    fn ready(tls: &UpstreamTls) -> Result<Ready, rustls::Error> {
        let roots = match &tls.trust {
            TrustAnchors::WellKnown => Arc::clone(public_roots()),
            TrustAnchors::Bundle(bundle) => {
                let mut store = RootCertStore::empty();
                for cert in &bundle.certs {
                    store.add(cert.clone())?;
                }
                Arc::new(store)
            }
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?;
        let builder = if tls.subject_alt_names.is_empty() {
            versions.with_root_certificates(roots)
        } else {
            // rustls' API for any verifier but its own is `dangerous()`; this
            // one runs rustls' own verification, once per accepted name.
            let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
            let names = tls
                .subject_alt_names
                .iter()
                .map(|n| {
                    ServerName::try_from(n.clone()).map_err(|e| {
                        rustls::Error::General(format!("subject alt name \"{n}\": {e}"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            versions
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyOfNames { inner, names }))
        };
        let config = match &tls.client_identity {
            Some(identity) => builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(
                Arc::clone(&identity.key),
            ))),
            None => builder.with_no_client_auth(),
        };
        let server_name = ServerName::try_from(tls.server_name.clone()).map_err(|e| {
            rustls::Error::General(format!("server name \"{}\": {e}", tls.server_name))
        })?;
        Ok(Ready {
            config: Arc::new(config),
            server_name,
            connectors: Arc::default(),
            sessions: Arc::default(),
        })
    }

    /// Shakes hands over `tcp`, done by `deadline` (the connect timeout
    /// bounds the TCP connect and the handshake together).
    pub(crate) async fn handshake(
        &self,
        tcp: TcpStream,
        deadline: Instant,
    ) -> Result<TlsStream<TcpStream>, (FailureKind, Stage)> {
        let ready = self
            .ready
            .as_ref()
            .map_err(|_| (FailureKind::TlsHandshake, Stage::Connect))?;
        // A peer gone between the connect and here: as if the connect had failed.
        let peer = tcp
            .peer_addr()
            .map_err(|_| (FailureKind::ConnectError, Stage::Connect))?;
        let connecting = ready
            .connector(peer, self.protocol)
            .connect(ready.server_name.clone(), tcp);
        let stream = match tokio::time::timeout_at(deadline, connecting).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err((classify_tls_error(&e), Stage::Connect)),
            Err(_) => return Err((FailureKind::TlsHandshake, Stage::Connect)),
        };
        if self.require_h2 && !selected_h2(&stream) {
            return Err((FailureKind::TlsHandshake, Stage::Connect));
        }
        let expires = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| expiry::not_after(leaf));
        if let Some(expires) = expires {
            lock(&self.expiries).insert(peer, expires);
        }
        Ok(stream)
    }
}

impl TlsOrigin {
    /// When the certificate `endpoint` presented last expires, in seconds
    /// since the epoch.
    pub(crate) fn expiry(&self, endpoint: SocketAddr) -> Option<i64> {
        lock(&self.expiries).get(&endpoint).copied()
    }
}

/// The ALPN protocols offered for `protocol` (RFC 7301; `h2` first when
/// both are, the order being the client's preference).
fn alpn(protocol: Protocol) -> Vec<Vec<u8>> {
    match protocol {
        Protocol::H2 => vec![b"h2".to_vec()],
        Protocol::Auto => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        Protocol::Http1 | Protocol::H2c => vec![b"http/1.1".to_vec()],
    }
}

/// True when the endpoint selected HTTP/2 in the handshake of `stream`.
pub(crate) fn selected_h2(stream: &TlsStream<TcpStream>) -> bool {
    stream.get_ref().1.alpn_protocol() == Some(b"h2")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The public roots (Mozilla's, as `webpki-roots` ships them), built once.
fn public_roots() -> &'static Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        Arc::new(RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        })
    })
}

/// Verifies the endpoint's certificate as rustls does, for any of `names`
/// instead of the SNI name (Gateway API's `subjectAltNames`): the chain,
/// validity and signatures once, the name against each until one matches.
#[derive(Debug)]
struct AnyOfNames {
    inner: Arc<WebPkiServerVerifier>,
    names: Vec<ServerName<'static>>,
}

impl ServerCertVerifier for AnyOfNames {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _sni: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut refused =
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        for name in &self.names {
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
            {
                Ok(verified) => return Ok(verified),
                // Only the name failed: the next name may match.
                Err(
                    e @ rustls::Error::InvalidCertificate(
                        rustls::CertificateError::NotValidForName
                        | rustls::CertificateError::NotValidForNameContext { .. },
                    ),
                ) => refused = e,
                Err(e) => return Err(e),
            }
        }
        Err(refused)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
