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
use hyper_util::rt::TokioIo;
use reprise_crds::protocol::{Ack, ACKS_PATH, NAMESPACE_HEADER, POD_HEADER, SNAPSHOTS_PATH};
use reprise_crds::traffic::TrafficReport;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::auth::{AuthError, Authenticator, Identity};
use super::groups::{Groups, DEBOUNCE};
use super::paced::Paced;
use super::source::SnapshotSource;
use super::stream;
use crate::listen::{Gate, Limits};
use crate::metrics::{Counter, Metrics};
use crate::sidecars::SidecarRegistry;
use crate::telemetry::{PushSpan, Tracing};

/// Longest ACK line (or POSTed ACK body) accepted: an ACK is a version and
/// perhaps an error message; anything longer is not one.
pub(super) const MAX_ACK_BYTES: usize = 64 * 1024;

/// Concurrent h2 streams on one push connection: a sidecar's stream is one.
const PUSH_MAX_STREAMS: u32 = 4;

/// The push listener's limits by default: room for every pod of a large
/// cluster, and per source address far more than a pod needs (its stream,
/// a reconnect) yet room for the sidecars of pods that share an address
/// (host network, a NAT before an out-of-cluster controller).
pub const PUSH_LIMITS: Limits = Limits {
    max_connections: 65_536,
    max_per_source: Some(256),
    header_timeout: std::time::Duration::from_secs(10),
    // Three heartbeats: a healthy stream moves every one.
    idle_timeout: std::time::Duration::from_secs(3 * reprise_crds::protocol::HEARTBEAT_SECS),
};

/// Failed authentications one source address may have back to back, then
/// one per [`FAILED_AUTH_EVERY`]; past that it is answered `429` before
/// any token check.
const FAILED_AUTH_BURST: u32 = 10;
const FAILED_AUTH_EVERY: std::time::Duration = std::time::Duration::from_secs(6);
/// Source addresses whose failures are remembered at most.
const FAILED_AUTH_SOURCES: usize = 4096;

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
    /// Failed authentications per source address.
    failed_auth: Paced<std::net::IpAddr>,
    /// NACK and resync log lines per pod.
    pub(super) nack_logs: Paced<(String, String)>,
    /// How each stream's lines are paced.
    pub(super) limits: StreamLimits,
    /// The listener's limits ([`PUSH_LIMITS`] unless set).
    listener: Limits,
}

/// How a stream's lines from a sidecar are paced (`stream.rs`).
#[derive(Clone, Copy, Debug)]
pub struct StreamLimits {
    /// Lines of any kind a stream may send back to back...
    pub line_burst: u32,
    /// ...then one per this; past it the stream is not read until its pace
    /// allows (TCP pushes back on the sidecar, at no cost here).
    pub line_every: std::time::Duration,
    /// Whole snapshots a stream may ask for again (resync) back to back,
    /// then one per this; a resync sooner waits.
    pub resync_every: std::time::Duration,
    /// NACKs of a stream logged back to back, then one per this (each is
    /// counted in `reprise_controller_nacks_total` all the same).
    pub nack_log_every: std::time::Duration,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            line_burst: 128,
            line_every: std::time::Duration::from_millis(25),
            resync_every: std::time::Duration::from_secs(10),
            nack_log_every: std::time::Duration::from_secs(10),
        }
    }
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
            failed_auth: Paced::new(FAILED_AUTH_BURST, FAILED_AUTH_EVERY, FAILED_AUTH_SOURCES),
            nack_logs: Paced::new(3, StreamLimits::default().nack_log_every, 16_384),
            limits: StreamLimits::default(),
            listener: PUSH_LIMITS,
        })
    }

    /// This server with streams paced by `limits` and its listener held to
    /// `listener` (tests set them short). Before it serves.
    pub fn with_limits(self: Arc<Self>, limits: StreamLimits, listener: Limits) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut server) => {
                server.limits = limits;
                server.nack_logs = Paced::new(3, limits.nack_log_every, 16_384);
                server.listener = listener;
                Arc::new(server)
            }
            Err(shared) => {
                tracing::warn!("push limits set after the server was shared: ignored");
                shared
            }
        }
    }

    /// Serves TLS connections on `listener` until `shutdown` resolves.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        shutdown: impl Future<Output = ()>,
    ) {
        let gate = Gate::new("push", self.listener);
        self.serve_within(listener, tls, shutdown, gate).await;
    }

    /// [`PushServer::serve`], its connections held to `gate` (which the
    /// metrics listener counts).
    pub async fn serve_within(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        shutdown: impl Future<Output = ()>,
        gate: Arc<Gate>,
    ) {
        if !self.publishing.swap(true, Ordering::AcqRel) {
            tokio::spawn(Arc::clone(&self).publish());
        }
        crate::tls::accept(listener, tls, shutdown, gate, move |tls, peer| {
            let server = Arc::clone(&self);
            let source = peer.ip().to_canonical();
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            async move {
                let limits = server.listener;
                let service = service_fn(move |req| {
                    let server = Arc::clone(&server);
                    // Authenticating, or reading a POSTed ACK, takes no
                    // longer than a head may; a stream's body is not timed.
                    let timeout = server.listener.header_timeout;
                    async move {
                        match tokio::time::timeout(timeout, server.handle(req, source)).await {
                            Ok(answered) => answered,
                            Err(_) => Ok(text(StatusCode::REQUEST_TIMEOUT, "request timeout\n")),
                        }
                    }
                });
                crate::listen::serve_http(
                    TokioIo::new(tls),
                    h2,
                    &limits,
                    PUSH_MAX_STREAMS,
                    service,
                )
                .await;
            }
        })
        .await;
    }

    /// Answers one request.
    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        source: std::net::IpAddr,
    ) -> Result<Response<PushBody>, Infallible> {
        let path = req.uri().path().to_string();
        let response = match (req.method(), path.as_str()) {
            (&Method::GET, SNAPSHOTS_PATH) => match self.identify(&req, source).await {
                Ok(id) => stream::open(self, id, req),
                Err(refused) => refused,
            },
            // An ACK is about a stream held here: one claiming a pod with
            // none is refused before its token costs anything.
            (&Method::POST, ACKS_PATH) if !self.holds_stream_of(&req) => text(
                StatusCode::CONFLICT,
                "no snapshot stream of this pod on this replica\n",
            ),
            (&Method::POST, ACKS_PATH) => match self.identify(&req, source).await {
                Ok(id) => self.ack(&id, req).await,
                Err(refused) => refused,
            },
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        };
        Ok(response)
    }

    /// Whether the pod `req`'s headers claim has a stream to this replica.
    fn holds_stream_of<B>(&self, req: &Request<B>) -> bool {
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        match (header(NAMESPACE_HEADER), header(POD_HEADER)) {
            (Some(ns), Some(pod)) => self.registry.get(ns, pod).is_some(),
            _ => false,
        }
    }

    /// The sidecar a request from `source` comes from, or the answer
    /// refusing it. A source that failed too often is answered `429` before
    /// its token is looked at.
    async fn identify<B>(
        &self,
        req: &Request<B>,
        source: std::net::IpAddr,
    ) -> Result<Identity, Response<PushBody>> {
        use crate::metrics::Labelled::PushAuthentications as Auth;
        if !self.failed_auth.may(&source) {
            self.metrics.count(Auth, "rate_limited", 1);
            return Err(text(
                StatusCode::TOO_MANY_REQUESTS,
                "too many failed authentications from this address; retry later\n",
            ));
        }
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
            self.failed_auth.spend(&source);
            self.metrics.count(Auth, "refused", 1);
            return Err(text(
                StatusCode::UNAUTHORIZED,
                &format!("{}\n", AuthError::Missing),
            ));
        };
        match self.auth.authenticate(&token, &ns, &pod).await {
            Ok(mut id) => {
                self.metrics.count(Auth, "accepted", 1);
                // Only what this build knows: an unknown capability would
                // make a snapshot group of its own.
                let known: Vec<&str> = reprise_crds::protocol::CAPABILITIES.split(',').collect();
                id.capabilities = reprise_crds::protocol::capabilities(req.headers())
                    .into_iter()
                    .filter(|c| known.contains(&c.as_str()))
                    .collect();
                Ok(id)
            }
            Err(AuthError::Api(e)) => {
                self.metrics.count(Auth, "unavailable", 1);
                tracing::warn!(namespace = %ns, pod = %pod, error = %e, "cannot check a sidecar token");
                Err(text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "cannot check the token now\n",
                ))
            }
            Err(e @ (AuthError::Busy | AuthError::TooOften)) => {
                self.metrics.count(Auth, "busy", 1);
                let status = if matches!(e, AuthError::Busy) {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::TOO_MANY_REQUESTS
                };
                Err(text(status, &format!("{e}; retry later\n")))
            }
            Err(e) => {
                self.metrics.count(Auth, "refused", 1);
                // Logged while the source is within its pace; then only counted.
                if self.failed_auth.may(&source) {
                    tracing::warn!(namespace = %crate::untrusted::logged(&ns, 253), pod = %crate::untrusted::logged(&pod, 253), %source, reason = %e, "sidecar refused");
                }
                self.failed_auth.spend(&source);
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

    /// Takes a traffic report from the sidecar `id`, checked and paced
    /// (`crate::traffic`), and counts what became of it. A refused report is
    /// dropped, never a reason to close the stream: a reconnect would cost
    /// this controller a TokenReview, a Pod read and a whole snapshot, far
    /// more than reading past the line, and the stream's lines are paced.
    pub(super) fn record_traffic(&self, id: &Identity, mut report: TrafficReport) {
        use crate::metrics::Labelled::{TrafficDropped, TrafficReports};
        use crate::sidecars::Taken;
        let dropped = match report.check() {
            Ok(dropped) => dropped,
            Err(e) => {
                self.metrics.count(TrafficReports, "invalid", 1);
                tracing::debug!(namespace = %id.namespace, pod = %id.pod, error = %e, "traffic report refused");
                return;
            }
        };
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let result = match self
            .registry
            .record_traffic(&id.namespace, &id.pod, report, now)
        {
            Taken::Recorded { unknown_policies } => {
                self.metrics
                    .count(TrafficDropped, "policy", unknown_policies);
                self.metrics.count(TrafficDropped, "field", dropped.fields);
                self.metrics.count(TrafficDropped, "name", dropped.names);
                "recorded"
            }
            Taken::TooSoon => "too_soon",
            Taken::AfterFinal => "after_final",
            Taken::NotConnected => "not_connected",
        };
        self.metrics.count(TrafficReports, result, 1);
    }

    /// Counts an ACK or NACK from the sidecar `id` and updates its sync state.
    pub(super) fn record_ack(&self, id: &Identity, ack: &Ack) {
        match &ack.error {
            Some(error) => {
                self.metrics.add(Counter::Nacks);
                self.registry.nack(&id.namespace, &id.pod, error);
                if let Some(span) = self.push_span(&id.namespace, &id.pod) {
                    span.nacked(error);
                }
                // Logged at a pace per pod, and cut: a NACK's message is the
                // sidecar's to write, up to a line's length.
                if self.nack_logs.take(&(id.namespace.clone(), id.pod.clone())) {
                    tracing::warn!(namespace = %id.namespace, pod = %id.pod, version = %crate::untrusted::logged(&ack.version, 128), error = %crate::untrusted::logged(error, super::stream::NACK_LOGGED_BYTES), "sidecar NACKed a snapshot");
                }
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
