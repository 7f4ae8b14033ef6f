//! A call chain on loopback, with the real binaries: `reprise-e2e-app`
//! processes in chain mode (`NEXT_HOP`, [`crate::hop`]) and a real
//! `reprise-sidecar` in front of each hop's calls, for the cancellation
//! tests (`e2e/tests/chain.rs`) and the measurement of attempts across
//! layers (`reprise-chain`).
//!
//! The client calls the first sidecar (its own pod's), which calls the
//! first hop's apps; each hop's apps call the next through the next
//! sidecar, and the last hop answers. On a node each pod has its own
//! sidecar; here one sidecar serves all the apps of a hop (the retry loop
//! and the deadline are per request, the budget per sidecar: one budget per
//! hop instead of one per pod). Every process is killed when the chain is
//! dropped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use reprise_testkit::config::{Config, ProxyConfig, Rule, UpstreamConfig};
use reprise_testkit::sidecar::{self, free_addr, Launch, Running};
use reprise_testkit::tls::TestCa;

pub use reprise_testkit::config::Retries;

/// How each sidecar reaches the next hop's apps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leg {
    /// HTTP/1.1.
    Http1,
    /// HTTP/2 in clear, prior knowledge.
    H2c,
    /// TLS the sidecar originates, ALPN `h2` or `http/1.1` (`protocol: auto`).
    Tls,
}

/// What to build.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The hops' names, first to last (each an upstream name, and its apps'
    /// `POD_NAME`s with a suffix).
    pub hops: Vec<&'static str>,
    /// Apps per hop: the endpoints a retry can move between.
    pub replicas: usize,
    /// How the sidecars reach the apps.
    pub leg: Leg,
    /// Each sidecar's retries block for its upstream (and its budget, which
    /// rules use too).
    pub retries: Retries,
    /// Rules, by sidecar: `rules[i]` for sidecar `i` (the client's is 0),
    /// none where the list is shorter.
    pub rules: Vec<Vec<Rule>>,
    /// The last hop's share of 503s.
    pub fail_percent: u32,
    /// The last hop's wait before answering (`DELAY_MS`; a request's
    /// `?delay_ms=` wins).
    pub delay_ms: u64,
    /// Each sidecar's `proxy` block.
    pub proxy: ProxyConfig,
    /// Extra environment for every sidecar.
    pub sidecar_env: Vec<(String, String)>,
    /// The chain's apps cancel their call when their request goes away.
    pub apps_cancel: bool,
}

/// One app process, killed when dropped.
#[derive(Debug)]
struct App {
    addr: SocketAddr,
    child: std::process::Child,
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running chain.
#[derive(Debug)]
pub struct Chain {
    /// `sidecars[0]` is the client's; `sidecars[i]` calls `hops[i]`.
    pub sidecars: Vec<Running>,
    apps: Vec<Vec<App>>,
    /// The apps' authority, when they serve TLS.
    ca: Option<TestCa>,
}

/// A hop's counts, summed over its apps (`/stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HopCounts {
    /// Requests begun.
    pub started: u64,
    /// Requests answered.
    pub finished: u64,
    /// Requests whose caller went away first.
    pub cancelled: u64,
    /// Calls made to the next hop.
    pub calls: u64,
    /// Calls cancelled with their request.
    pub calls_cancelled: u64,
}

impl Chain {
    /// Starts the apps last hop first, then the sidecars.
    pub async fn start(spec: &Spec) -> anyhow::Result<Chain> {
        let app_bin = sidecar::binary("reprise-e2e-app")?;
        let sidecar_bin = sidecar::binary("reprise-sidecar")
            .context("build it first: cargo build -p reprise-sidecar")?;
        let ca = (spec.leg == Leg::Tls).then(|| TestCa::new("chain"));
        let n = spec.hops.len();
        // Each sidecar's listen address is known before it starts: apps
        // point HTTP_PROXY at it.
        let dir = std::env::temp_dir().join(format!(
            "reprise-chain-{}-{}",
            std::process::id(),
            free_addr().port()
        ));
        std::fs::create_dir_all(&dir)?;
        let configs: Vec<PathBuf> = (0..n)
            .map(|i| dir.join(format!("sidecar-{i}.yaml")))
            .collect();
        let launches: Vec<Launch> = configs
            .iter()
            .map(|path| Launch::new(&sidecar_bin, path))
            .collect();
        let mut apps: Vec<Vec<App>> = Vec::with_capacity(n);
        for (i, hop) in spec.hops.iter().enumerate() {
            let mut replicas = Vec::with_capacity(spec.replicas);
            for r in 0..spec.replicas {
                let addr = free_addr();
                let mut cmd = std::process::Command::new(&app_bin);
                cmd.env("PORT", addr.port().to_string())
                    .env("POD_NAME", format!("{hop}-{r}"))
                    .env("POD_IP", "127.0.0.1")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                match spec.hops.get(i + 1) {
                    Some(next) => {
                        cmd.env("NEXT_HOP", next)
                            .env(
                                "HTTP_PROXY",
                                format!("http://{}", launches[i + 1].listen_addr()),
                            )
                            .env("CANCEL_CALLS", spec.apps_cancel.to_string());
                    }
                    None => {
                        cmd.env("FAIL_PERCENT", spec.fail_percent.to_string())
                            .env("DELAY_MS", spec.delay_ms.to_string());
                    }
                }
                if let Some(ca) = &ca {
                    let id = ca.issue(&format!("{hop}-{r}"), &[hop, "127.0.0.1"]);
                    cmd.env("TLS_CERT_FILE", &id.cert_file)
                        .env("TLS_KEY_FILE", &id.key_file);
                }
                let child = cmd.spawn().context("starting reprise-e2e-app")?;
                replicas.push(App { addr, child });
            }
            apps.push(replicas);
        }
        for hop in &apps {
            for app in hop {
                listening(app.addr).await?;
            }
        }
        let mut sidecars = Vec::with_capacity(n);
        for (i, launch) in launches.into_iter().enumerate() {
            let mut upstream = UpstreamConfig::new(spec.hops[i])
                .endpoints(apps[i].iter().map(|a| a.addr))
                .retries(spec.retries.clone());
            upstream = match (spec.leg, &ca) {
                (Leg::Http1, _) => upstream,
                (Leg::H2c, _) => upstream.h2c(),
                (Leg::Tls, Some(ca)) => {
                    upstream.auto().tls(Some(&ca.ca_file()), Some(spec.hops[i]))
                }
                (Leg::Tls, None) => bail!("TLS without an authority"),
            };
            let mut config = Config::new().upstream(upstream).proxy(spec.proxy.clone());
            for rule in spec.rules.get(i).into_iter().flatten() {
                config = config.rule(rule.clone());
            }
            config.write(&configs[i])?;
            let env: Vec<(&str, &str)> = spec
                .sidecar_env
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            sidecars.push(launch.envs(&env).start().await?);
        }
        Ok(Chain { sidecars, apps, ca })
    }

    /// The client's sidecar: send requests here with the first hop as host.
    pub fn entry(&self) -> SocketAddr {
        self.sidecars[0].listen
    }

    /// What hop `i` did, summed over its apps.
    pub async fn counts(&self, i: usize) -> anyhow::Result<HopCounts> {
        let mut sum = HopCounts::default();
        for app in &self.apps[i] {
            let stats = stats(app.addr, self.ca.as_ref()).await?;
            let n = |k: &str| stats[k].as_u64().unwrap_or(0);
            sum.started += n("started");
            sum.finished += n("finished");
            sum.cancelled += n("cancelled");
            sum.calls += n("calls");
            sum.calls_cancelled += n("calls_cancelled");
        }
        Ok(sum)
    }

    /// The requests hop `i`'s apps saw with a `chain.request` id, all apps
    /// together.
    pub async fn seen(&self, i: usize) -> anyhow::Result<Vec<crate::hop::Seen>> {
        let mut out = Vec::new();
        for app in &self.apps[i] {
            let stats = stats(app.addr, self.ca.as_ref()).await?;
            let seen: Vec<crate::hop::Seen> = serde_json::from_value(stats["seen"].clone())?;
            out.extend(seen);
        }
        Ok(out)
    }

    /// Every hop's counts, first to last.
    pub async fn all_counts(&self) -> anyhow::Result<Vec<HopCounts>> {
        let mut out = Vec::with_capacity(self.apps.len());
        for i in 0..self.apps.len() {
            out.push(self.counts(i).await?);
        }
        Ok(out)
    }
}

/// Waits until something listens on `addr`.
async fn listening(addr: SocketAddr) -> anyhow::Result<()> {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("nothing listens on {addr}")
}

/// An app's `/stats` (over TLS, trusting `ca`, when it serves TLS).
async fn stats(addr: SocketAddr, ca: Option<&TestCa>) -> anyhow::Result<serde_json::Value> {
    let Some(ca) = ca else {
        let response = reprise_testkit::client::get(addr, "stats", "/stats").await?;
        return Ok(serde_json::from_slice(&response.body)?);
    };
    use http_body_util::BodyExt;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca.cert_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?.to_owned();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let request = http::Request::get("/stats")
        .header(http::header::HOST, "stats")
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let body = sender
        .send_request(request)
        .await?
        .into_body()
        .collect()
        .await?;
    Ok(serde_json::from_slice(&body.to_bytes())?)
}
