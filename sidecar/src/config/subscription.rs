//! Kubernetes mode: subscribe to the controller's snapshot stream over TLS,
//! validate each snapshot with the shared rules, swap it in atomically, ACK or
//! NACK it, and keep the last good one on disk for restarts while the
//! controller is away.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rand::Rng;
use reprise_crds::policy::DeadlinePolicy;
use reprise_crds::protocol::{
    self, HEARTBEAT_SECS, MAX_LINE_BYTES, NAMESPACE_HEADER, POD_HEADER, SNAPSHOTS_PATH,
    VERSION_PARAM,
};
use reprise_crds::sidecar_env as env;
use reprise_crds::snapshot::{Snapshot, DELTA_PREFIX};
use reprise_crds::traffic::{SidecarLine, CAPABILITY_TRAFFIC, REPORT_SECS};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

mod apply;
mod farewell;

pub use apply::{Running, SAVE_EVERY};
pub use farewell::{Farewell, FAREWELL_TIMEOUT};

use super::address_map::AddressMap;
use crate::proxy::Proxy;
use crate::Error;

/// Where and as whom to subscribe (from the environment; `docs/src/reference/environment.md`).
#[derive(Clone, Debug)]
pub struct Subscription {
    /// `https://host:port` of the controller's push endpoint.
    pub controller: Uri,
    /// TLS server name to verify (default: the URI's host).
    pub server_name: Option<String>,
    /// This pod's name.
    pub pod: String,
    /// This pod's namespace.
    pub namespace: String,
    /// Projected ServiceAccount token (audience `reprise`), re-read on every connect.
    pub token_path: PathBuf,
    /// CA certificate(s) that signed the controller's certificate.
    pub ca: TrustedCa,
    /// Where the last good snapshot is kept.
    pub snapshot_path: PathBuf,
    /// Endpoint address rewrite for local test clusters (see [`AddressMap`]).
    pub address_map: Option<AddressMap>,
    /// How often the traffic of each policy is reported to a controller that
    /// reads reports ([`REPORT_SECS`] outside tests).
    pub report_every: Duration,
    /// `proxy.diagnostics_retained` for every snapshot
    /// (`REPRISE_DIAGNOSTICS_RETAINED`); `None` keeps the default.
    pub diagnostics_retained: Option<usize>,
    /// `proxy.deadlines` for every snapshot (`REPRISE_DEADLINE_PROPAGATE`,
    /// `REPRISE_DEADLINE_ACCEPT_INCOMING`; unset is on).
    pub deadlines: DeadlinePolicy,
}

/// A `true`/`false` switch variable's value; unset is `true`.
fn switch(variable: &'static str, value: Option<String>) -> Result<bool, Error> {
    match value.as_deref().map(str::trim) {
        None | Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(Error::Environment {
            variable,
            rule: format!("must be true or false (got {other:?})"),
            source: None,
        }),
    }
}

/// `REPRISE_DIAGNOSTICS_RETAINED`'s value, in the file field's range.
fn diagnostics_retained(value: &str) -> Result<usize, Error> {
    let max = reprise_crds::file::MAX_DIAGNOSTICS_RETAINED;
    match value.trim().parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(Error::Environment {
            variable: env::DIAGNOSTICS_RETAINED,
            rule: format!("must be a whole number in 0..={max} (got {value:?})"),
            source: None,
        }),
    }
}

/// Where the controller's CA comes from.
#[derive(Clone, Debug)]
pub enum TrustedCa {
    /// A PEM file (`REPRISE_CA_PATH`).
    File(PathBuf),
    /// PEM text (`REPRISE_CA_PEM`, set by the injection webhook).
    Pem(String),
}

impl Subscription {
    /// Settings from `REPRISE_*` environment variables; `None` when
    /// `REPRISE_CONTROLLER` is unset (standalone mode).
    pub fn from_env() -> Result<Option<Subscription>, Error> {
        let Ok(controller) = std::env::var(env::CONTROLLER) else {
            return Ok(None);
        };
        let controller: Uri = controller.parse().map_err(|e| Error::Environment {
            variable: env::CONTROLLER,
            rule: format!("not a URI: {e}"),
            source: Some(e),
        })?;
        let var = |name: &'static str| {
            std::env::var(name).map_err(|_| Error::Environment {
                variable: name,
                rule: "must be set in Kubernetes mode".into(),
                source: None,
            })
        };
        let path = |name: &str, default: &str| {
            PathBuf::from(std::env::var(name).unwrap_or_else(|_| default.to_string()))
        };
        Ok(Some(Subscription {
            controller,
            server_name: std::env::var(env::CONTROLLER_SERVER_NAME).ok(),
            pod: var(env::POD_NAME)?,
            namespace: var(env::POD_NAMESPACE)?,
            token_path: path(env::TOKEN_PATH, env::DEFAULT_TOKEN_PATH),
            ca: match std::env::var(env::CA_PEM) {
                Ok(pem) if !pem.trim().is_empty() => TrustedCa::Pem(pem),
                _ => TrustedCa::File(path(env::CA_PATH, env::DEFAULT_CA_PATH)),
            },
            snapshot_path: path(env::SNAPSHOT_PATH, env::DEFAULT_SNAPSHOT_PATH),
            address_map: std::env::var(env::ENDPOINT_ADDRESS_MAP)
                .ok()
                .map(|s| AddressMap::parse(&s))
                .transpose()
                .map_err(|rule| Error::Environment {
                    variable: env::ENDPOINT_ADDRESS_MAP,
                    rule,
                    source: None,
                })?,
            report_every: Duration::from_secs(REPORT_SECS),
            diagnostics_retained: std::env::var(env::DIAGNOSTICS_RETAINED)
                .ok()
                .map(|v| diagnostics_retained(&v))
                .transpose()?,
            deadlines: DeadlinePolicy {
                propagate: switch(
                    env::DEADLINE_PROPAGATE,
                    std::env::var(env::DEADLINE_PROPAGATE).ok(),
                )?,
                accept_incoming: switch(
                    env::DEADLINE_ACCEPT_INCOMING,
                    std::env::var(env::DEADLINE_ACCEPT_INCOMING).ok(),
                )?,
            },
        }))
    }

    /// What the pod's environment changes in a snapshot's configuration:
    /// the address map, the diagnostics' retention, the deadlines' switches.
    pub fn adjust(&self, config: &mut reprise_crds::Config) {
        if let Some(map) = &self.address_map {
            map.apply(config);
        }
        if let Some(n) = self.diagnostics_retained {
            config.proxy.diagnostics_retained = n;
        }
        config.proxy.deadlines = self.deadlines;
    }

    /// The last good snapshot on disk, if there is one and it still validates.
    pub fn load_saved(&self) -> Option<(Snapshot, reprise_crds::Config)> {
        let bytes = std::fs::read(&self.snapshot_path).ok()?;
        let snapshot: Snapshot = match serde_json::from_slice(&bytes) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(path = %self.snapshot_path.display(), error = %e, "saved snapshot is corrupt; ignoring it");
                return None;
            }
        };
        match snapshot.resolve() {
            Ok(mut config) => {
                self.adjust(&mut config);
                Some((snapshot, config))
            }

            Err(e) => {
                tracing::warn!(path = %self.snapshot_path.display(), error = %e, "saved snapshot does not validate; ignoring it");
                None
            }
        }
    }

    /// Keeps subscribing forever, reconnecting with jittered exponential
    /// backoff; `version` is the snapshot the proxy runs, to resume from.
    pub async fn run(self, proxy: Arc<Proxy>, version: Option<String>) {
        self.run_from(proxy, Running::version(version), &Farewell::default())
            .await;
    }

    /// [`Subscription::run`], from the snapshot the proxy runs (the saved
    /// one): deltas apply to it without a whole snapshot first.
    pub async fn resume(self, proxy: Arc<Proxy>, saved: Snapshot) {
        self.run_from(proxy, Running::snapshot(saved), &Farewell::default())
            .await;
    }

    /// [`Subscription::run`] or, with `saved`, [`Subscription::resume`],
    /// sending a final traffic report when `farewell` asks (the sidecar is
    /// stopping): on the stream, or on a new one when it is between two.
    pub async fn run_until_farewell(
        self,
        proxy: Arc<Proxy>,
        saved: Option<Snapshot>,
        farewell: Farewell,
    ) {
        let running = match saved {
            Some(s) => Running::snapshot(s),
            None => Running::version(None),
        };
        self.run_from(proxy, running, &farewell).await;
    }

    async fn run_from(self, proxy: Arc<Proxy>, mut running: Running, farewell: &Farewell) {
        let mut delay = Duration::from_millis(200);
        loop {
            let started = tokio::time::Instant::now();
            let result = self.session_with(&proxy, &mut running, farewell).await;
            // What the deltas of the stream left unwritten.
            self.save_running(&mut running);
            if started.elapsed() > Duration::from_secs(10) {
                // A session that lived a while was healthy: start backing off afresh.
                delay = Duration::from_millis(200);
            }
            match result {
                Ok(()) => {
                    tracing::info!("controller closed the snapshot stream; reconnecting");
                    delay = Duration::from_millis(200);
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?delay, "snapshot subscription failed; serving the last good snapshot")
                }
            }
            if farewell.is_said() {
                return; // the final report went out: nothing more to say
            }
            let jittered = delay.mul_f64(rand::rng().random_range(0.5..1.0));
            // Asked for the final report meanwhile: connect at once to send it.
            tokio::select! {
                () = tokio::time::sleep(jittered) => {}
                () = farewell.asked() => {}
            }
            delay = (delay * 2).min(Duration::from_secs(30));
        }
    }

    /// One connection: an upgraded bidirectional stream (see
    /// [`reprise_crds::protocol`]): snapshot lines in, one ACK line out per
    /// snapshot, until it ends.
    pub async fn session(&self, proxy: &Arc<Proxy>, running: &mut Running) -> Result<(), Error> {
        self.session_with(proxy, running, &Farewell::default())
            .await
    }

    /// [`Subscription::session`], sending the final report when `farewell`
    /// asks for it.
    async fn session_with(
        &self,
        proxy: &Arc<Proxy>,
        running: &mut Running,
        farewell: &Farewell,
    ) -> Result<(), Error> {
        let token = read(&self.token_path)?.trim().to_string();
        let mut sender = self.connect().await?;
        let mut uri = format!("{}{SNAPSHOTS_PATH}", self.base());
        let version = &running.version;
        if let Some(v) = version.as_deref() {
            uri.push_str(&format!("?{VERSION_PARAM}={v}"));
        }
        let mut request = self.request("GET", &uri, &token, Bytes::new())?;
        protocol::insert_upgrade_headers(request.headers_mut());
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| connection_failed("sending the subscription request", e))?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(Error::Refused {
                status,
                message: String::from_utf8_lossy(&body).trim().to_string(),
            });
        }
        // Traffic reports go only to a controller that reads them: an older
        // one closes the stream on a line it does not know.
        let reports = protocol::capabilities(response.headers()).contains(CAPABILITY_TRAFFIC);
        let io = hyper::upgrade::on(response)
            .await
            .map_err(|e| connection_failed("upgrading to the push stream", e))?;
        tracing::info!(controller = %self.controller, resume = ?version, traffic_reports = reports, "subscribed to the controller");
        let (read, write) = tokio::io::split(TokioIo::new(io));
        // One writer for ACKs and traffic reports, so lines never interleave.
        let (lines, mut to_send) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
        let (reports_out, mut to_report) = tokio::sync::mpsc::channel::<(Vec<u8>, bool)>(1);
        let writer = async move {
            let mut write = write;
            loop {
                let (line, last) = tokio::select! {
                    biased;
                    line = to_send.recv() => match line {
                        Some(l) => (l, false),
                        None => return Ok::<(), std::io::Error>(()),
                    },
                    report = to_report.recv() => match report {
                        Some(r) => r,
                        None => return std::future::pending().await,
                    },
                };
                write.write_all(&line).await?;
                write.flush().await?;
                if last {
                    // Written and flushed: the final report has left.
                    farewell.said();
                }
            }
        };
        let reporter = {
            let (proxy, report_every) = (Arc::clone(proxy), self.report_every);
            async move {
                if !reports {
                    farewell.asked().await;
                    // An older controller reads no report: nothing to say.
                    farewell.said();
                    return std::future::pending().await;
                }
                let mut every = tokio::time::interval(report_every);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                every.tick().await;
                loop {
                    let last = tokio::select! {
                        biased;
                        () = farewell.asked() => true,
                        _ = every.tick() => false,
                    };
                    let mut report = proxy.routes().traffic_report();
                    report.last = last;
                    if report.traffic.is_empty() {
                        if last {
                            farewell.said();
                            return std::future::pending().await;
                        }
                        continue;
                    }
                    let mut line = serde_json::to_vec(&report).unwrap_or_default();
                    line.push(b'\n');
                    if reports_out.send((line, last)).await.is_err() || last {
                        return std::future::pending().await;
                    }
                }
            }
        };
        let reader = self.read_snapshots(proxy, read, running, lines);
        tokio::select! {
            r = reader => r,
            r = writer => r.map_err(|e| connection_failed("sending on the push stream", e)),
            () = reporter => Ok(()),
        }
    }

    /// Reads snapshot lines from `read` and queues an ACK or NACK line for
    /// each on `acks`, until the stream ends.
    async fn read_snapshots(
        &self,
        proxy: &Arc<Proxy>,
        read: tokio::io::ReadHalf<TokioIo<hyper::upgrade::Upgraded>>,
        running: &mut Running,
        acks: tokio::sync::mpsc::Sender<Vec<u8>>,
    ) -> Result<(), Error> {
        let mut reader = tokio::io::BufReader::new(read);
        let mut line = Vec::new();
        // The controller sends a heartbeat every HEARTBEAT_SECS: silence for
        // three of them means the connection is dead even if TCP has not noticed.
        let silence = Duration::from_secs(3 * HEARTBEAT_SECS);
        let mut heard = tokio::time::Instant::now();
        loop {
            let dead = heard + silence;
            // Wake early to write a snapshot the deltas left unwritten; a
            // line being read stays in `line` (`read_until` appends) and is
            // read on.
            let wake = running.save_due().map_or(dead, |due| due.min(dead));
            let limit = (MAX_LINE_BYTES - line.len().min(MAX_LINE_BYTES)) as u64;
            let read = match tokio::time::timeout_at(
                wake,
                (&mut reader).take(limit).read_until(b'\n', &mut line),
            )
            .await
            {
                Ok(read) => read.map_err(|e| connection_failed("reading the push stream", e))?,
                Err(_) if tokio::time::Instant::now() < dead => {
                    self.save_if_due(running);
                    continue;
                }
                Err(_) => {
                    return Err(Error::Connection {
                        what: "no heartbeat for three heartbeat intervals",
                        source: None,
                    })
                }
            };
            heard = tokio::time::Instant::now();
            if read == 0 && line.is_empty() {
                return Ok(());
            }
            if !line.ends_with(b"\n") {
                if read > 0 && line.len() < MAX_LINE_BYTES {
                    continue; // more of the line to come
                }
                return Err(Error::Connection {
                    what: "snapshot line over the size limit, or cut short",
                    source: None,
                });
            }
            let text = &line[..line.len() - 1];
            if text.iter().all(u8::is_ascii_whitespace) {
                line.clear();
                continue; // heartbeat
            }
            let answer = self.apply_line(proxy, text, running);
            line.clear();
            let mut out = serde_json::to_vec(&answer).unwrap_or_default();
            out.push(b'\n');
            if acks.send(out).await.is_err() {
                return Ok(()); // the writer ended: its error is the session's
            }
        }
    }

    /// Applies one line of the push stream (a whole snapshot or a delta,
    /// without its newline) to what `running` holds and `proxy` serves;
    /// returns the answer to send.
    pub fn apply_line(&self, proxy: &Proxy, line: &[u8], running: &mut Running) -> SidecarLine {
        if line.starts_with(DELTA_PREFIX) {
            self.apply_delta(proxy, line, running)
        } else {
            SidecarLine::Ack(self.apply(proxy, line, running))
        }
    }

    fn base(&self) -> String {
        let authority = self
            .controller
            .authority()
            .map(|a| a.as_str())
            .unwrap_or("");
        format!("https://{authority}")
    }

    fn request(
        &self,
        method: &str,
        uri: &str,
        token: &str,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, Error> {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(
                http::header::HOST,
                self.controller.authority().map_or("", |a| a.as_str()),
            )
            .header("authorization", format!("Bearer {token}"))
            .header(POD_HEADER, &self.pod)
            .header(NAMESPACE_HEADER, &self.namespace)
            .header(protocol::CAPABILITIES_HEADER, protocol::CAPABILITIES)
            .header("content-type", "application/json")
            .body(Full::new(body))
            .map_err(|e| connection_failed("building the request", e))
    }

    async fn connect(&self) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, Error> {
        let host = self
            .controller
            .host()
            .unwrap_or("localhost")
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = self.controller.port_u16().unwrap_or(443);
        let mut roots = rustls::RootCertStore::empty();
        let (ca, origin) = match &self.ca {
            TrustedCa::File(path) => (
                std::fs::read(path).map_err(|source| Error::File {
                    path: path.display().to_string(),
                    source,
                })?,
                path.display().to_string(),
            ),
            TrustedCa::Pem(pem) => (pem.clone().into_bytes(), env::CA_PEM.to_string()),
        };
        for cert in CertificateDer::pem_slice_iter(&ca) {
            let cert = cert.map_err(|e| tls_failed(format!("reading {origin}"), e))?;
            roots
                .add(cert)
                .map_err(|e| tls_failed(format!("a certificate of {origin}"), e))?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_failed("protocol versions".into(), e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        // HTTP/1.1: the stream is upgraded to a plain bidirectional one.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = self.server_name.clone().unwrap_or_else(|| host.clone());
        let server_name = ServerName::try_from(name)
            .map_err(|e| tls_failed("the controller's name".into(), e))?;
        let tcp = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        .map_err(|_| Error::Connection {
            what: "connect timed out",
            source: None,
        })?
        .map_err(|e| connection_failed("connecting", e))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(server_name, tcp)
            .await
            .map_err(|e| tls_failed("handshake with the controller".into(), e))?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(tls))
            .await
            .map_err(|e| connection_failed("the HTTP handshake", e))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "controller connection ended");
            }
        });
        Ok(sender)
    }
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::File {
        path: path.display().to_string(),
        source,
    })
}

/// A failed step of the conversation with the controller.
fn connection_failed(
    what: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::Connection {
        what,
        source: Some(Box::new(e)),
    }
}

/// A failed step of the TLS setup.
fn tls_failed(what: String, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::Tls {
        what,
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retention_variable_is_checked_and_set_on_every_snapshot() {
        assert_eq!(diagnostics_retained(" 0 ").ok(), Some(0));
        assert_eq!(diagnostics_retained("1000").ok(), Some(1000));
        for bad in ["1001", "-1", "lots", ""] {
            let e = diagnostics_retained(bad).expect_err(bad).to_string();
            assert!(
                e.starts_with("REPRISE_DIAGNOSTICS_RETAINED: must be a whole number in 0..=1000"),
                "{bad:?}: {e}"
            );
        }
        let subscription = Subscription {
            controller: Uri::from_static("https://controller:15010"),
            server_name: None,
            pod: "p".into(),
            namespace: "n".into(),
            token_path: PathBuf::from("/t"),
            ca: TrustedCa::Pem(String::new()),
            snapshot_path: PathBuf::from("/s"),
            address_map: None,
            report_every: Duration::from_secs(REPORT_SECS),
            diagnostics_retained: Some(7),
            deadlines: DeadlinePolicy {
                propagate: false,
                accept_incoming: true,
            },
        };
        let mut config = Snapshot::new(Vec::new(), Vec::new())
            .resolve()
            .expect("the empty snapshot");
        assert_eq!(config.proxy.diagnostics_retained, 100, "the default");
        assert_eq!(config.proxy.deadlines, DeadlinePolicy::ON, "the default");
        subscription.adjust(&mut config);
        assert_eq!(config.proxy.diagnostics_retained, 7);
        assert!(!config.proxy.deadlines.propagate);
        assert!(config.proxy.deadlines.accept_incoming);
    }

    #[test]
    fn the_deadline_switches_are_on_unless_false_and_anything_else_is_refused() {
        let v = |s: &str| Some(s.to_string());
        assert!(switch(env::DEADLINE_PROPAGATE, None).expect("unset"));
        assert!(switch(env::DEADLINE_PROPAGATE, v("true")).expect("true"));
        assert!(!switch(env::DEADLINE_PROPAGATE, v(" false ")).expect("false"));
        for bad in ["off", "0", "False", ""] {
            let e = switch(env::DEADLINE_ACCEPT_INCOMING, v(bad))
                .expect_err(bad)
                .to_string();
            assert!(
                e.starts_with("REPRISE_DEADLINE_ACCEPT_INCOMING: must be true or false"),
                "{bad:?}: {e}"
            );
        }
    }
}
