//! Wires the controller together: watchers, the reconciler (leader only), the
//! push server (every replica) and the metrics endpoint.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use reprise_crds::resource::RetryPolicy;
use tokio::sync::{mpsc, watch};

use crate::auth::TokenReviewer;
use crate::injection::InjectionConfig;
use crate::leader::{self, LeaseSettings};
use crate::metrics::Metrics;
use crate::push::PushServer;
use crate::reconcile::{self, Context};
use crate::sidecars::SidecarRegistry;
use crate::source::StoreSource;
use crate::telemetry::Tracing;
use crate::{peers, tls, Error};

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Push stream listener.
    pub push_addr: SocketAddr,
    /// Metrics and health listener.
    pub metrics_addr: SocketAddr,
    /// Directory with (or for generated) `ca.crt`, `tls.crt`, `tls.key`.
    pub tls_dir: PathBuf,
    /// Names in a generated serving certificate.
    pub tls_sans: Vec<String>,
    /// Lease election; `None` runs as the only replica.
    pub lease: Option<LeaseSettings>,
    /// Keep the TLS material in this Secret (of `namespace`) instead of `tls_dir`.
    pub tls_secret: Option<String>,
    /// The controller's own namespace.
    pub namespace: String,
    /// The sidecar-injecting webhook, when enabled.
    pub webhook: Option<WebhookOptions>,
    /// OpenTelemetry spans of reconciles and pushes (off: records nothing).
    pub tracing: Tracing,
}

/// The injection webhook's settings.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    /// HTTPS listener.
    pub addr: SocketAddr,
    /// What injected sidecars look like.
    pub injection: InjectionConfig,
    /// MutatingWebhookConfiguration whose caBundle the controller keeps set;
    /// `None` when something else (cert-manager) does it.
    pub configuration: Option<String>,
}

/// Runs until the process is stopped.
pub async fn run(client: Client, options: Options) -> Result<(), Error> {
    let metrics = Arc::new(Metrics::default());
    let registry = Arc::new(SidecarRegistry::default());
    let (changes_tx, changes_rx) = watch::channel(0u64);
    let changes_tx = Arc::new(changes_tx);

    // Watchers feeding the snapshot source; every event bumps `changes`.
    let (policies, policy_writer) = reflector::store::<RetryPolicy>();
    let (services, service_writer) = reflector::store::<Service>();
    let (slices, slice_writer) = reflector::store::<EndpointSlice>();
    spawn_reflector(
        Api::<RetryPolicy>::all(client.clone()),
        watcher::Config::default(),
        policy_writer,
        Arc::clone(&changes_tx),
    );
    spawn_reflector(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
        service_writer,
        Arc::clone(&changes_tx),
    );
    spawn_reflector(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
        slice_writer,
        Arc::clone(&changes_tx),
    );

    // The push server runs on every replica.
    let material = match &options.tls_secret {
        Some(name) => {
            tls::load_or_create_secret(client.clone(), &options.namespace, name, &options.tls_sans)
                .await?
        }
        None => tls::load_or_generate(&options.tls_dir, &options.tls_sans)?,
    };
    let tls_config = tls::server_config(&material)?;
    if let Some(webhook) = options.webhook.clone() {
        let native = crate::webhook::supports_native_sidecars(&client).await;
        let server = Arc::new(crate::webhook::Webhook::new(
            webhook.injection,
            material.ca_pem.clone(),
            native,
            Arc::clone(&metrics),
        ));
        let listener = tokio::net::TcpListener::bind(webhook.addr)
            .await
            .map_err(|e| Error::Tls(format!("cannot listen on {}: {e}", webhook.addr)))?;
        tracing::info!(addr = %webhook.addr, native, "injection webhook listening");
        tokio::spawn(server.serve(listener, Arc::clone(&tls_config)));
        if let Some(name) = webhook.configuration {
            tokio::spawn(crate::webhook::keep_ca_bundle(
                client.clone(),
                name,
                material.ca_pem.clone(),
            ));
        }
    }
    let (sync_tx, sync_rx) = mpsc::unbounded_channel::<String>();
    let source = Arc::new(StoreSource {
        policies: policies.clone(),
        services,
        slices,
        changes: changes_rx,
    });
    let push = PushServer::new(
        Arc::new(TokenReviewer::new(client.clone())),
        source,
        Arc::clone(&registry),
        Arc::clone(&metrics),
        Some(sync_tx),
        options.tracing.clone(),
    );
    let listener = tokio::net::TcpListener::bind(options.push_addr)
        .await
        .map_err(|e| Error::Tls(format!("cannot listen on {}: {e}", options.push_addr)))?;
    tracing::info!(addr = %options.push_addr, "push server listening");
    tokio::spawn(push.serve(listener, tls_config, std::future::pending()));
    tokio::spawn(serve_metrics(
        options.metrics_addr,
        Arc::clone(&metrics),
        Arc::clone(&registry),
        options.tracing.clone(),
    ));

    // Only the leader reconciles; with several replicas, each publishes its
    // sidecars' sync counts for the leader to add up.
    let (leading_tx, mut leading) = watch::channel(options.lease.is_none());
    let mut peers = None;
    if let Some(lease) = options.lease.clone() {
        let (store, writer) = reflector::store::<ConfigMap>();
        let api = Api::<ConfigMap>::namespaced(client.clone(), &lease.namespace);
        // Peer counts do not change snapshots: their events need not wake the push streams.
        let (quiet, _) = watch::channel(0u64);
        spawn_reflector(
            api,
            watcher::Config::default().labels(peers::LABEL),
            writer,
            Arc::new(quiet),
        );

        tokio::spawn(peers::publish(
            client.clone(),
            lease.namespace.clone(),
            lease.identity.clone(),
            policies.clone(),
            Arc::clone(&registry),
        ));
        peers = Some((store, lease.identity.clone()));
        tokio::spawn(leader::run(client.clone(), lease, leading_tx));
    }

    // Shared so that a replica that loses and regains leadership keeps receiving ACK triggers.
    let sync_rx = Arc::new(std::sync::Mutex::new(sync_rx));
    loop {
        while !*leading.borrow_and_update() {
            if leading.changed().await.is_err() {
                return Ok(());
            }
        }
        let ctx = Arc::new(Context {
            client: client.clone(),
            recorder: Some(Recorder::new(
                client.clone(),
                Reporter {
                    controller: "reprise-controller".into(),
                    instance: std::env::var("POD_NAME").ok(),
                },
            )),
            metrics: Arc::clone(&metrics),
            sidecars: Arc::clone(&registry),
            failures: Default::default(),
            peers: peers.clone(),
            tracing: options.tracing.clone(),
        });
        let rx = Arc::clone(&sync_rx);
        let peer_ns = options.lease.as_ref().map(|l| l.namespace.clone());
        let controller = controller(client.clone(), policies.clone(), ctx, rx, peer_ns);

        tokio::select! {
            () = controller => return Ok(()),
            () = lost(&mut leading) => tracing::warn!("leadership lost: reconciler stopped"),
        }
    }
}

async fn lost(leading: &mut watch::Receiver<bool>) {
    while *leading.borrow_and_update() {
        if leading.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

async fn controller(
    client: Client,
    policies: reflector::Store<RetryPolicy>,
    ctx: Arc<Context>,
    sync_rx: Arc<std::sync::Mutex<mpsc::UnboundedReceiver<String>>>,
    peer_ns: Option<String>,
) {
    let by_target = move |ns: Option<String>, target: Option<String>| {
        policies
            .state()
            .into_iter()
            .filter(|p| p.namespace() == ns && Some(&p.spec.target_ref.name) == target.as_ref())
            .map(|p| ObjectRef::from_obj(&*p))
            .collect::<Vec<_>>()
    };
    let by_target_for_slices = by_target.clone();
    // Only one controller runs at a time, so the lock is never contended.
    let acks = futures_util::stream::poll_fn(move |cx| {
        sync_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .poll_recv(cx)
    })
    .filter_map(|id: String| async move {
        let (ns, name) = id.split_once('/')?;
        Some(ObjectRef::<RetryPolicy>::new(name).within(ns))
    });
    let mut controller = Controller::new(
        Api::<RetryPolicy>::all(client.clone()),
        watcher::Config::default(),
    );
    if let Some(ns) = peer_ns {
        // A peer's new counts re-trigger the policies it reports on.
        controller = controller.watches(
            Api::<ConfigMap>::namespaced(client.clone(), &ns),
            watcher::Config::default().labels(peers::LABEL),
            |cm| {
                cm.data
                    .as_ref()
                    .and_then(|d| d.get("report"))
                    .and_then(|r| serde_json::from_str::<peers::PeerReport>(r).ok())
                    .map(|r| {
                        r.counts
                            .keys()
                            .filter_map(|id| id.split_once('/'))
                            .map(|(ns, name)| ObjectRef::<RetryPolicy>::new(name).within(ns))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
            },
        );
    }
    controller
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(100)))
        .watches(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
            move |svc| by_target(svc.namespace(), Some(svc.name_any())),
        )
        .watches(
            Api::<EndpointSlice>::all(client),
            watcher::Config::default(),
            move |slice| {
                let target = slice.labels().get("kubernetes.io/service-name").cloned();
                by_target_for_slices(slice.namespace(), target)
            },
        )
        .reconcile_on(acks)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile stream");
            }
        })
        .await;
}

fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    changes: Arc<watch::Sender<u64>>,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    tokio::spawn(async move {
        watcher(api, config)
            .default_backoff()
            .reflect(writer)
            .for_each(|event| {
                if let Err(e) = &event {
                    tracing::warn!(error = %e, "watch failed; retrying");
                }
                changes.send_modify(|n| *n = n.wrapping_add(1));
                async {}
            })
            .await;
    });
}

async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    registry: Arc<SidecarRegistry>,
    traces: Tracing,
) {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, error = %e, "cannot listen for metrics");
            return;
        }
    };
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (metrics, registry, traces) =
            (Arc::clone(&metrics), Arc::clone(&registry), traces.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let (body, content_type) = match req.uri().path() {
                    "/metrics" => (
                        metrics.render(registry.connected(), traces.counters()),
                        "text/plain; version=0.0.4; charset=utf-8",
                    ),
                    "/healthz" | "/readyz" => ("ok\n".to_string(), "text/plain"),
                    _ => (String::new(), "text/plain"),
                };
                let status = if body.is_empty() { 404 } else { 200 };
                let mut resp = http::Response::new(Full::new(bytes::Bytes::from(body)));
                *resp.status_mut() = http::StatusCode::from_u16(status).unwrap_or_default();
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static(content_type),
                );
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
