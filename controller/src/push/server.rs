//! The push server's listener and requests: who is asking, which request it
//! is (a snapshot stream, a POSTed ACK), what an ACK changes, and the task
//! that publishes changes to the groups of alike sidecars they affect.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use reprise_crds::protocol::{Ack, ACKS_PATH, NAMESPACE_HEADER, POD_HEADER, SNAPSHOTS_PATH};
use reprise_crds::traffic::TrafficReport;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::auth::{AuthError, Authenticator, Identity};
use super::groups::{Groups, DEBOUNCE};
use super::source::SnapshotSource;
use super::stream;
use crate::metrics::{Counter, Metrics};
use crate::sidecars::SidecarRegistry;
use crate::telemetry::{PushSpan, Tracing};

/// Longest ACK line (or POSTed ACK body) accepted: an ACK is a version and
/// perhaps an error message; anything longer is not one.
pub(super) const MAX_ACK_BYTES: usize = 64 * 1024;

/// The body of every push response.
pub(super) type PushBody = BoxBody<Bytes, Infallible>;

/// The push server's shared state.
pub struct PushServer {
    /// Checks sidecar tokens.
    auth: Arc<dyn Authenticator>,
    /// Computes snapshots.
    pub(super) source: Arc<dyn SnapshotSource>,
    /// Connected sidecars.
    pub(super) registry: Arc<SidecarRegistry>,
    /// Metrics.
    pub(super) metrics: Arc<Metrics>,
    /// Policies (`namespace/name`) whose sync counts changed, for the reconciler.
    on_sync: Option<mpsc::UnboundedSender<String>>,
    /// Numbers each stream, so a reconnect's registration outlives the old one's.
    connections: AtomicU64,
    /// Alike sidecars' shared snapshots, so thousands of them cost one
    /// computation and one encoding per change.
    pub(super) groups: Groups,
    /// Set once the task publishing changes runs.
    publishing: std::sync::atomic::AtomicBool,
    /// Spans of pushes (off: records nothing).
    tracing: Tracing,
    /// Spans of pushes awaiting their ACK, by namespace and pod (empty when
    /// tracing is off).
    pending: Mutex<HashMap<(String, String), PushSpan>>,
}

impl std::fmt::Debug for PushServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushServer").finish_non_exhaustive()
    }
}

impl PushServer {
    /// A push server authenticating with `auth`, pushing what `source`
    /// computes, keeping the connected sidecars in `registry`, and telling
    /// `on_sync` which policies' sync counts changed.
    pub fn new(
        auth: Arc<dyn Authenticator>,
        source: Arc<dyn SnapshotSource>,
        registry: Arc<SidecarRegistry>,
        metrics: Arc<Metrics>,
        on_sync: Option<mpsc::UnboundedSender<String>>,
        tracing: Tracing,
    ) -> Arc<Self> {
        Arc::new(Self {
            auth,
            source,
            registry,
            metrics,
            on_sync,
            connections: AtomicU64::new(0),
            groups: Groups::default(),
            publishing: std::sync::atomic::AtomicBool::new(false),
            tracing,
            pending: Mutex::default(),
        })
    }

    /// Serves TLS connections on `listener` until `shutdown` resolves.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        shutdown: impl Future<Output = ()>,
    ) {
        if !self.publishing.swap(true, Ordering::AcqRel) {
            tokio::spawn(Arc::clone(&self).publish());
        }
        crate::tls::accept(listener, tls, shutdown, "push", move |tls| {
            let server = Arc::clone(&self);
            async move {
                let service = service_fn(move |req| Arc::clone(&server).handle(req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(tls), service)
                    .await;
            }
        })
        .await;
    }

    /// Answers one request.
    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<PushBody>, Infallible> {
        let path = req.uri().path().to_string();
        let response = match (req.method(), path.as_str()) {
            (&Method::GET, SNAPSHOTS_PATH) => match self.identify(&req).await {
                Ok(id) => stream::open(self, id, req),
                Err(refused) => refused,
            },
            (&Method::POST, ACKS_PATH) => match self.identify(&req).await {
                Ok(id) => self.ack(&id, req).await,
                Err(refused) => refused,
            },
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        };
        Ok(response)
    }

    /// The sidecar a request comes from, or the answer refusing it.
    async fn identify<B>(&self, req: &Request<B>) -> Result<Identity, Response<PushBody>> {
        let header = |name: &str| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let token =
            header("authorization").and_then(|v| v.strip_prefix("Bearer ").map(str::to_string));
        let (Some(token), Some(ns), Some(pod)) =
            (token, header(NAMESPACE_HEADER), header(POD_HEADER))
        else {
            return Err(text(
                StatusCode::UNAUTHORIZED,
                &format!("{}\n", AuthError::Missing),
            ));
        };
        match self.auth.authenticate(&token, &ns, &pod).await {
            Ok(mut id) => {
                id.capabilities = reprise_crds::protocol::capabilities(req.headers());
                Ok(id)
            }
            Err(AuthError::Api(e)) => {
                tracing::warn!(namespace = %ns, pod = %pod, error = %e, "cannot check a sidecar token");
                Err(text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "cannot check the token now\n",
                ))
            }
            Err(e) => {
                tracing::warn!(namespace = %ns, pod = %pod, reason = %e, "sidecar refused");
                Err(text(StatusCode::FORBIDDEN, &format!("{e}\n")))
            }
        }
    }

    /// `POST /v1/acks`: the ACK of a sidecar whose stream is not upgraded.
    async fn ack(&self, id: &Identity, req: Request<Incoming>) -> Response<PushBody> {
        let body = match Limited::new(req.into_body(), MAX_ACK_BYTES).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    "ack body too large or unreadable\n",
                )
            }
        };
        let ack: Ack = match serde_json::from_slice(&body) {
            Ok(a) => a,
            Err(e) => return text(StatusCode::BAD_REQUEST, &format!("invalid ack: {e}\n")),
        };
        self.record_ack(id, &ack);
        Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(BodyExt::boxed(Full::new(Bytes::new())))
            .unwrap_or_default()
    }

    /// Counts an ACK or NACK from the sidecar `id` and updates its sync state.
    pub(super) fn record_traffic(&self, id: &Identity, report: TrafficReport) {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        self.registry
            .record_traffic(&id.namespace, &id.pod, report, now);
    }

    pub(super) fn record_ack(&self, id: &Identity, ack: &Ack) {
        match &ack.error {
            Some(error) => {
                self.metrics.add(Counter::Nacks);
                self.registry.nack(&id.namespace, &id.pod, error);
                if let Some(span) = self.push_span(&id.namespace, &id.pod) {
                    span.nacked(error);
                }
                tracing::warn!(namespace = %id.namespace, pod = %id.pod, version = %ack.version, error = %error, "sidecar NACKed a snapshot");
            }
            None => {
                self.metrics.add(Counter::Acks);
                if let Some(latency) = self.registry.since_sent(&id.namespace, &id.pod) {
                    self.metrics.push_acked(latency);
                    if let Some(span) = self.push_span(&id.namespace, &id.pod) {
                        span.acked(latency);
                    }
                }
                if let Some(touched) = self.registry.ack(&id.namespace, &id.pod, &ack.version) {
                    self.notify(touched);
                }
            }
        }
    }

    /// Tells the reconciler that these policies' sync counts changed.
    pub(super) fn notify(&self, policies: Vec<String>) {
        if let Some(tx) = &self.on_sync {
            for p in policies {
                let _ = tx.send(p);
            }
        }
    }

    /// A number no other stream of this server has.
    pub(super) fn next_connection(&self) -> u64 {
        self.connections.fetch_add(1, Ordering::Relaxed)
    }

    /// Starts the span of a push; a push still awaiting its ACK is replaced
    /// (its span ends as dropped).
    pub(super) fn push_started(&self, id: &Identity, version: &str) {
        if self.tracing.is_on() {
            let span = PushSpan::start(&self.tracing, &id.namespace, &id.pod, version);
            self.lock_pending()
                .insert((id.namespace.clone(), id.pod.clone()), span);
        }
    }

    /// The span of the push awaiting an ACK from `namespace/pod`, taken out.
    pub(super) fn push_span(&self, namespace: &str, pod: &str) -> Option<PushSpan> {
        if !self.tracing.is_on() {
            return None;
        }
        self.lock_pending()
            .remove(&(namespace.to_string(), pod.to_string()))
    }

    /// Publishes changes, batched: after a change, waits [`DEBOUNCE`] for
    /// more, then computes again the snapshots of the groups the batch may
    /// affect; only the streams of groups whose version changed wake. Runs
    /// as long as the change source.
    async fn publish(self: Arc<Self>) {
        let mut changes = self.source.changes();
        while changes.changed().await.is_ok() {
            tokio::time::sleep(DEBOUNCE).await;
            changes.borrow_and_update();
            let server = Arc::clone(&self);
            // Off the runtime's threads: a fresh list computes every group.
            let refreshed = tokio::task::spawn_blocking(move || {
                let changed = server.source.take_changed();
                let groups = server.groups.affected(&changed);
                let published = groups.iter().filter(|g| g.refresh(&*server.source)).count();
                (groups.len(), published)
            })
            .await;
            if let Ok((computed, published)) = refreshed {
                self.metrics.groups_refreshed(computed, published);
                self.metrics.set_groups(self.groups.len());
            }
        }
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), PushSpan>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A plain-text answer.
pub(super) fn text(status: StatusCode, body: &str) -> Response<PushBody> {
    let mut r = Response::new(BodyExt::boxed(Full::new(Bytes::from(body.to_string()))));
    *r.status_mut() = status;
    r
}
