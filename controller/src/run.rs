//! Wires the controller together (`docs/src/concepts/controller.md`). Every replica runs the shared cache, the push server,
//! the webhook and the metrics listener; with leader election it also
//! publishes its sidecars' sync counts and competes for the Lease; only the
//! leader runs the reconciler.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use kube::runtime::events::{Recorder, Reporter};
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::cache::{Cache, Relay};
use crate::inject::{self, InjectionConfig, WebhookLimits};
use crate::leader::{self, LeaseSettings};
use crate::listen::{Gate, Limits};
use crate::metrics::{self, Metrics};
use crate::push::{CacheSource, PushServer, TokenReviewer};
use crate::reconcile::peers::{self, Peers};
use crate::reconcile::{gateway, triggers, Context, MANAGER};
use crate::sidecars::SidecarRegistry;
use crate::telemetry::Tracing;
use crate::{tls, Error};

/// How the controller runs (built from the command line by
/// [`RunArgs::options`](crate::cli::RunArgs::options)).
#[derive(Clone, Debug)]
pub struct Options {
    /// Push stream listener.
    pub(crate) push_addr: SocketAddr,
    /// What it holds its connections to.
    pub(crate) push_limits: Limits,
    /// Metrics and health listener; its /debug/sidecars pages (what each
    /// connected sidecar was last sent) answer loopback connections only.
    pub(crate) metrics_addr: SocketAddr,
    /// What it holds its connections to.
    pub(crate) metrics_limits: Limits,
    /// Where the CA and serving certificate are kept.
    pub(crate) tls: TlsSource,
    /// Names in a generated serving certificate.
    pub(crate) tls_sans: Vec<String>,
    /// Lease election; `None` runs as the only replica.
    pub(crate) lease: Option<LeaseSettings>,
    /// The controller's own namespace (its TLS Secret's).
    pub(crate) namespace: String,
    /// The sidecar-injecting webhook, when enabled.
    pub(crate) webhook: Option<WebhookOptions>,
    /// OpenTelemetry spans of reconciles and pushes (off: records nothing).
    pub(crate) tracing: Tracing,
    /// The `reportingInstance` of the Events this replica records.
    pub(crate) reporter_instance: Option<String>,
}

/// Where the CA and serving certificate are kept (generated when absent).
#[derive(Clone, Debug)]
pub(crate) enum TlsSource {
    /// `ca.crt`, `tls.crt`, `tls.key` in this directory.
    Dir(PathBuf),
    /// This Secret of the controller's namespace, shared by every replica.
    Secret(String),
}

/// The injection webhook's settings.
#[derive(Clone, Debug)]
pub(crate) struct WebhookOptions {
    /// HTTPS listener.
    pub(crate) addr: SocketAddr,
    /// What injected sidecars look like.
    pub(crate) injection: InjectionConfig,
    /// MutatingWebhookConfiguration whose caBundle the controller keeps set;
    /// `None` when something else (cert-manager) does it.
    pub(crate) configuration: Option<String>,
    /// What its listener holds requests to.
    pub(crate) limits: WebhookLimits,
}

/// Runs until the process is stopped.
pub async fn run(client: Client, options: Options) -> Result<(), Error> {
    let metrics = Arc::new(Metrics::default());
    let registry = Arc::new(SidecarRegistry::default());
    let cache = Cache::start(
        &client,
        options.lease.as_ref().map(|l| l.namespace.as_str()),
    );

    let material = match &options.tls {
        TlsSource::Secret(name) => {
            tls::load_or_create_secret(client.clone(), &options.namespace, name, &options.tls_sans)
                .await?
        }
        TlsSource::Dir(dir) => tls::load_or_generate(dir, &options.tls_sans)?,
    };
    let (tls_config, serving) = tls::server_config_reloadable(&material)?;
    // A generated serving certificate is renewed before it expires.
    let store = match &options.tls {
        TlsSource::Secret(name) => tls::Store::Secret {
            client: client.clone(),
            namespace: options.namespace.clone(),
            name: name.clone(),
        },
        TlsSource::Dir(dir) => tls::Store::Dir(dir.clone()),
    };
    tokio::spawn(tls::keep_renewed(
        store,
        options.tls_sans.clone(),
        Arc::clone(&serving),
    ));
    if let Some(webhook) = &options.webhook {
        let native = inject::supports_native_sidecars(&client).await;
        let server = Arc::new(
            inject::Webhook::new(
                webhook.injection.clone(),
                material.ca_pem.clone(),
                native,
                Arc::clone(&metrics),
                // The Services are watched already: no extra access for the API server's address.
                inject::ApiServer::from_cache_and_env(cache.clone()),
            )
            .with_certificate(material.cert_pem.clone())
            .with_namespaces(inject::Namespaces::new(client.clone()))
            .with_serving(Arc::clone(&serving))
            .with_limits(webhook.limits),
        );
        let listener = bind(webhook.addr).await?;
        tracing::info!(addr = %webhook.addr, native, "injection webhook listening");
        let gate = Gate::new("webhook", server.listener_limits());
        metrics.listener(&gate);
        tokio::spawn(server.serve(listener, Arc::clone(&tls_config), gate));
        if let Some(name) = webhook.configuration.clone() {
            tokio::spawn(inject::keep_ca_bundle(
                client.clone(),
                name,
                material.ca_pem.clone(),
            ));
        }
    }
    let gate = Gate::new("metrics", options.metrics_limits);
    metrics.listener(&gate);
    tokio::spawn(metrics::serve(
        options.metrics_addr,
        Arc::clone(&metrics),
        Arc::clone(&registry),
        options.tracing.clone(),
        gate,
    ));

    // The push server reports every replica's changed sync counts; they
    // reach the reconciler only while this replica leads.
    let synced = Arc::new(Relay::default());
    let (sync_tx, mut sync_rx) = mpsc::unbounded_channel::<String>();
    let relay = Arc::clone(&synced);
    tokio::spawn(async move {
        while let Some(policy) = sync_rx.recv().await {
            relay.send(policy);
        }
    });
    let push = PushServer::new(
        Arc::new(TokenReviewer::new(client.clone())),
        Arc::new(CacheSource::new(cache.clone())),
        Arc::clone(&registry),
        Arc::clone(&metrics),
        Some(sync_tx),
        options.tracing.clone(),
    );
    let listener = bind(options.push_addr).await?;
    // Nothing is pushed from a half-filled cache: a sidecar would apply it.
    if !cache.ready().await {
        return Ok(());
    }
    tracing::info!(addr = %options.push_addr, "push server listening");
    let gate = Gate::new("push", options.push_limits);
    metrics.listener(&gate);
    tokio::spawn(push.serve_within(listener, tls_config, std::future::pending(), gate));

    // Only the leader reconciles; with several replicas, each publishes its
    // sidecars' sync counts for the leader to add up.
    let (leading_tx, mut leading) = watch::channel(options.lease.is_none());
    let mut peers = None;
    if let Some(lease) = options.lease.clone() {
        tokio::spawn(peers::publish(
            client.clone(),
            lease.namespace.clone(),
            lease.identity.clone(),
            cache.clone(),
            Arc::clone(&registry),
        ));
        peers = cache
            .peers
            .as_ref()
            .map(|watched| Peers::new(watched.store.clone(), lease.identity.clone()));
        tokio::spawn(leader::run(client.clone(), lease, leading_tx));
    }

    loop {
        while !*leading.borrow_and_update() {
            if leading.changed().await.is_err() {
                return Ok(());
            }
        }
        let ctx = Arc::new(Context {
            recorder: Some(Recorder::new(
                client.clone(),
                Reporter {
                    controller: MANAGER.into(),
                    instance: options.reporter_instance.clone(),
                },
            )),
            metrics: Arc::clone(&metrics),
            sidecars: Arc::clone(&registry),
            peers: peers.clone(),
            ..Context::new(client.clone(), cache.clone(), options.tracing.clone())
        });
        tokio::select! {
            () = triggers::run(cache.clone(), Arc::clone(&ctx), synced.subscribe()) => return Ok(()),
            () = gateway::run(ctx) => return Ok(()),
            () = lost(&mut leading) => tracing::warn!("leadership lost: reconciler stopped"),
        }
    }
}

/// Binds a listener on `addr`.
async fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

/// Resolves when this replica stops leading (never, without an election).
async fn lost(leading: &mut watch::Receiver<bool>) {
    while *leading.borrow_and_update() {
        if leading.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}
