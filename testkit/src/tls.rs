//! TLS for tests: a certificate authority made on the spot ([`TestCa`]) and
//! a TLS front ([`TlsFront`]) that terminates TLS (on loopback unless told
//! otherwise) and relays the bytes to a plain-text server behind it, so
//! every fault the test kit's upstream can act out also happens behind TLS.
//! Its faults of its own are the handshake's: a certificate for another
//! name, expired, from another authority; plain text where TLS is expected;
//! a reset mid-handshake; a required client certificate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{HandshakeKind, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

/// A certificate authority for one test, and the files of what it issues.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The authority's own certificate, PEM.
    pub cert_pem: String,
    dir: PathBuf,
}

/// A certificate and its key, PEM, and where they were written.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PEM.
    pub key_pem: String,
    /// The certificate's file.
    pub cert_file: PathBuf,
    /// The key's file.
    pub key_file: PathBuf,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl TestCa {
    /// A new authority named `name`, its files in a fresh temporary folder.
    pub fn new(name: &str) -> TestCa {
        let dir = std::env::temp_dir().join(format!(
            "reprise-ca-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a folder for the authority");
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params
            .self_signed(&key)
            .expect("the authority's certificate");
        let ca = TestCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            dir,
        };
        std::fs::write(ca.ca_file(), &ca.cert_pem).expect("the authority's file");
        ca
    }

    /// The authority's certificate as a PEM file (a trust bundle).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A certificate for `names` (DNS names or IP addresses), valid now.
    pub fn issue(&self, label: &str, names: &[&str]) -> Issued {
        self.issue_with(label, names, |_| {})
    }

    /// A certificate for `names` whose parameters `adjust` changes (its
    /// validity, say).
    pub fn issue_with(
        &self,
        label: &str,
        names: &[&str],
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> Issued {
        let key = KeyPair::generate().expect("a key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name.push(DnType::CommonName, label);
        adjust(&mut params);
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        let issued = Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_file: self.dir.join(format!("{label}.pem")),
            key_file: self.dir.join(format!("{label}.key")),
        };
        std::fs::write(&issued.cert_file, &issued.cert_pem).expect("the certificate's file");
        std::fs::write(&issued.key_file, &issued.key_pem).expect("the key's file");
        issued
    }

    /// The folder the authority writes its files in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// How a [`TlsFront`] serves TLS.
#[derive(Clone, Debug)]
pub struct FrontSettings {
    /// The certificate it presents.
    pub identity: Issued,
    /// The ALPN protocols it selects from, in its order of preference
    /// (none: it selects none).
    pub alpn: Vec<&'static str>,
    /// Client certificates it requires, issued by this authority's
    /// certificate (PEM); none asks for none.
    pub client_ca_pem: Option<String>,
}

impl FrontSettings {
    /// Presents `identity`, selects `http/1.1` when offered, asks for no
    /// client certificate.
    pub fn new(identity: Issued) -> FrontSettings {
        FrontSettings {
            identity,
            alpn: vec!["http/1.1"],
            client_ca_pem: None,
        }
    }

    /// Selects from `alpn` instead.
    pub fn alpn(mut self, alpn: &[&'static str]) -> FrontSettings {
        self.alpn = alpn.to_vec();
        self
    }

    /// Requires a client certificate issued by `ca_pem`.
    pub fn require_client_cert(mut self, ca_pem: &str) -> FrontSettings {
        self.client_ca_pem = Some(ca_pem.to_string());
        self
    }
}

/// TLS in front of a plain-text server: each connection's handshake, then
/// its bytes relayed both ways. Stops when dropped.
#[derive(Debug)]
pub struct TlsFront {
    /// Where it listens.
    pub addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    resumed: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TlsFront {
    /// TLS with `settings` in front of `backend`, on a free loopback port.
    pub async fn start(backend: SocketAddr, settings: FrontSettings) -> TlsFront {
        TlsFront::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), backend, settings).await
    }

    /// [`TlsFront::start`] listening on `bind` (an address of a network
    /// namespace's own, say).
    pub async fn start_on(
        bind: SocketAddr,
        backend: SocketAddr,
        settings: FrontSettings,
    ) -> TlsFront {
        let acceptor = TlsAcceptor::from(Arc::new(server_config(&settings)));
        let listener = TcpListener::bind(bind)
            .await
            .unwrap_or_else(|e| panic!("listen on {bind}: {e}"));
        let addr = listener.local_addr().expect("addr");
        let handshakes = Arc::new(AtomicUsize::new(0));
        let resumed = Arc::new(AtomicUsize::new(0));
        let (counted, counted_resumed) = (Arc::clone(&handshakes), Arc::clone(&resumed));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let counted = Arc::clone(&counted);
                let counted_resumed = Arc::clone(&counted_resumed);
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::Relaxed);
                    if tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed) {
                        counted_resumed.fetch_add(1, Ordering::Relaxed);
                    }
                    let Ok(mut plain) = TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        TlsFront {
            addr,
            handshakes,
            resumed,
            task,
        }
    }

    /// Handshakes completed so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::Relaxed)
    }

    /// Of those, the ones that resumed a session (the rest were full).
    pub fn resumed(&self) -> usize {
        self.resumed.load(Ordering::Relaxed)
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn server_config(settings: &FrontSettings) -> ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(settings.identity.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("the certificate's PEM");
    let key =
        PrivateKeyDer::from_pem_slice(settings.identity.key_pem.as_bytes()).expect("the key's PEM");
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("TLS versions");
    let builder = match &settings.client_ca_pem {
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(cert.expect("PEM")).expect("a root");
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("a client verifier");
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .expect("the certificate and its key");
    config.alpn_protocols = settings
        .alpn
        .iter()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    config
}
