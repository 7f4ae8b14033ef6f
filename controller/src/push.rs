//! The push server: sidecars hold a TLS stream open and receive their snapshot
//! on every change (debounced); they answer with ACK or NACK. See
//! [`reprise_crds::protocol`] for the wire format.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use reprise_crds::protocol::{
    Ack, ACKS_PATH, HEARTBEAT_SECS, NAMESPACE_HEADER, POD_HEADER, SNAPSHOTS_PATH, UPGRADE_PROTOCOL,
    VERSION_PARAM,
};
use reprise_crds::snapshot::Snapshot;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::auth::{AuthError, Authenticator, Identity};
use crate::metrics::Metrics;
use crate::sidecars::SidecarRegistry;
use crate::telemetry::{PushSpan, Tracing};

/// Computes snapshots and announces changes. A trait so the protocol can be
/// tested without an API server.
pub trait SnapshotSource: Send + Sync + 'static {
    /// The snapshot for one sidecar. It must depend only on the sidecar's
    /// namespace and labels: the server shares it between sidecars alike.
    fn snapshot_for(&self, id: &Identity) -> Snapshot;

    /// Bumped on every change to anything snapshots are made of.
    fn changes(&self) -> watch::Receiver<u64>;
}

/// Longest ACK line (or POSTed ACK body) accepted: an ACK is a version and
/// perhaps an error message; anything longer is not one.
const MAX_ACK_BYTES: usize = 64 * 1024;

/// Changes closer together than this are pushed once.
pub const DEBOUNCE: Duration = Duration::from_millis(50);

/// The push server's shared state.
pub struct PushServer {
    /// Checks sidecar tokens.
    pub auth: Arc<dyn Authenticator>,
    /// Computes snapshots.
    pub source: Arc<dyn SnapshotSource>,
    /// Connected sidecars.
    pub registry: Arc<SidecarRegistry>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Policies (`namespace/name`) whose sync counts changed, for the reconciler.
    pub on_sync: Option<mpsc::UnboundedSender<String>>,
    connections: AtomicU64,
    /// Snapshots of the current change generation, by namespace and labels,
    /// so thousands of alike sidecars cost one computation and one encoding.
    cache: Mutex<SnapshotCache>,
    /// Spans of pushes awaiting their ACK, by namespace and pod (empty when
    /// tracing is off).
    tracing: Tracing,
    pending: Mutex<HashMap<(String, String), PushSpan>>,
}

/// Namespace and sorted labels: what a snapshot depends on.
type CacheKey = (String, Vec<(String, String)>);

#[derive(Default)]
struct SnapshotCache {
    generation: u64,
    entries: HashMap<CacheKey, Arc<Encoded>>,
}

/// A snapshot and its wire form.
struct Encoded {
    version: String,
    policies: HashMap<String, i64>,
    line: Bytes,
}

type PushBody = BoxBody<Bytes, Infallible>;

/// Ends a sidecar's registration when its stream is dropped.
struct Registration {
    server: Arc<PushServer>,
    namespace: String,
    pod: String,
    connection: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let touched = self
            .server
            .registry
            .disconnect(&self.namespace, &self.pod, self.connection);
        self.server.notify(touched);
        if let Some(span) = self.server.push_span(&self.namespace, &self.pod) {
            span.dropped();
        }
        tracing::info!(namespace = %self.namespace, pod = %self.pod, "sidecar disconnected");
    }
}

impl std::fmt::Debug for PushServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushServer").finish_non_exhaustive()
    }
}

impl PushServer {
    /// A push server.
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
            cache: Mutex::default(),
            tracing,
            pending: Mutex::default(),
        })
    }

    /// Starts the span of a push; a push still awaiting its ACK is replaced
    /// (its span ends as dropped).
    fn push_started(&self, id: &Identity, version: &str) {
        if self.tracing.is_on() {
            let span = PushSpan::start(&self.tracing, &id.namespace, &id.pod, version);
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert((id.namespace.clone(), id.pod.clone()), span);
        }
    }

    fn push_span(&self, namespace: &str, pod: &str) -> Option<PushSpan> {
        if !self.tracing.is_on() {
            return None;
        }
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(namespace.to_string(), pod.to_string()))
    }

    /// The encoded snapshot for `id` at change generation `generation`.
    fn encoded(&self, id: &Identity, generation: u64) -> Arc<Encoded> {
        let key = (
            id.namespace.clone(),
            id.labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>(),
        );
        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if cache.generation != generation {
                cache.generation = generation;
                cache.entries.clear();
            }
            if let Some(e) = cache.entries.get(&key) {
                return Arc::clone(e);
            }
        }
        let snapshot = self.source.snapshot_for(id);
        let mut line = serde_json::to_vec(&snapshot).unwrap_or_default();
        line.push(b'\n');
        let encoded = Arc::new(Encoded {
            policies: policies_of(&snapshot),
            version: snapshot.version,
            line: Bytes::from(line),
        });
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.generation == generation {
            cache.entries.insert(key, Arc::clone(&encoded));
        }
        encoded
    }

    /// Serves TLS connections on `listener` until `shutdown` resolves.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        shutdown: impl Future<Output = ()>,
    ) {
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

    /// Handles one request.
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<PushBody>, Infallible> {
        let path = req.uri().path().to_string();
        let response = match (req.method(), path.as_str()) {
            (&Method::GET, SNAPSHOTS_PATH) => self.stream(req).await,
            (&Method::POST, ACKS_PATH) => self.ack(req).await,
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        };
        Ok(response)
    }

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
            Ok(id) => Ok(id),
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

    async fn stream(self: Arc<Self>, mut req: Request<Incoming>) -> Response<PushBody> {
        let id = match self.identify(&req).await {
            Ok(id) => id,
            Err(resp) => return resp,
        };
        let resume = req.uri().query().and_then(|q| {
            q.split('&')
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == VERSION_PARAM)
                .map(|(_, v)| v.to_string())
        });
        let connection = self.connections.fetch_add(1, Ordering::Relaxed);
        self.registry
            .connect(&id.namespace, &id.pod, id.labels.clone(), connection);
        tracing::info!(namespace = %id.namespace, pod = %id.pod, resume = ?resume, "sidecar connected");
        let registration = Registration {
            server: Arc::clone(&self),
            namespace: id.namespace.clone(),
            pod: id.pod.clone(),
            connection,
        };
        let rx = self.source.changes();
        // Resume: when the sidecar already runs the current version, it is in sync without a push.
        let current = self.encoded(&id, *rx.borrow());
        let mut last = None;
        if resume.as_deref() == Some(current.version.as_str()) {
            self.registry.sent(
                &id.namespace,
                &id.pod,
                &current.version,
                current.policies.clone(),
            );
            let touched = self
                .registry
                .ack(&id.namespace, &id.pod, &current.version)
                .unwrap_or_default();
            self.notify(touched);
            last = Some(current.version.clone());
        }

        let state = StreamState {
            server: self,
            id,
            last,
            rx,
            first: true,
            _registration: registration,
        };
        let upgrade = req.headers().get(http::header::UPGRADE).is_some_and(|v| {
            v.as_bytes()
                .eq_ignore_ascii_case(UPGRADE_PROTOCOL.as_bytes())
        });
        if upgrade {
            let on_upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                match on_upgrade.await {
                    Ok(io) => session(TokioIo::new(io), state).await,
                    Err(e) => tracing::debug!(error = %e, "push upgrade failed"),
                }
            });
            let mut response = Response::new(BodyExt::boxed(Full::new(Bytes::new())));
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let headers = response.headers_mut();
            headers.insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("upgrade"),
            );
            headers.insert(
                http::header::UPGRADE,
                http::HeaderValue::from_static(UPGRADE_PROTOCOL),
            );
            return response;
        }
        let frames = futures_util::stream::unfold(state, next_frame);
        let mut response = Response::new(BodyExt::boxed(StreamBody::new(frames)));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-ndjson"),
        );
        response
    }

    async fn ack(self: Arc<Self>, req: Request<Incoming>) -> Response<PushBody> {
        let id = match self.identify(&req).await {
            Ok(id) => id,
            Err(resp) => return resp,
        };
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
        self.record_ack(&id, &ack);
        Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(BodyExt::boxed(Full::new(Bytes::new())))
            .unwrap_or_default()
    }

    /// Counts an ACK or NACK from the sidecar `id` and updates its sync state.
    fn record_ack(&self, id: &Identity, ack: &Ack) {
        match &ack.error {
            Some(error) => {
                self.metrics.nacks.fetch_add(1, Ordering::Relaxed);
                self.registry.nack(&id.namespace, &id.pod, error);
                if let Some(span) = self.push_span(&id.namespace, &id.pod) {
                    span.nacked(error);
                }
                tracing::warn!(namespace = %id.namespace, pod = %id.pod, version = %ack.version, error = %error, "sidecar NACKed a snapshot");
            }
            None => {
                self.metrics.acks.fetch_add(1, Ordering::Relaxed);
                if let Some(latency) = self.registry.since_sent(&id.namespace, &id.pod) {
                    self.metrics.push_latency.observe(latency);
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

    fn notify(&self, policies: Vec<String>) {
        if let Some(tx) = &self.on_sync {
            for p in policies {
                let _ = tx.send(p);
            }
        }
    }
}

struct StreamState {
    server: Arc<PushServer>,
    id: Identity,
    last: Option<String>,
    rx: watch::Receiver<u64>,
    first: bool,
    _registration: Registration,
}

async fn next_frame(
    mut st: StreamState,
) -> Option<(Result<Frame<Bytes>, Infallible>, StreamState)> {
    let line = st.next_line().await?;
    Some((Ok(Frame::data(line)), st))
}

impl StreamState {
    /// The next line to send: the snapshot when it changed, else a heartbeat.
    /// `None` when the change source is gone.
    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if !self.first {
                tokio::select! {
                    changed = self.rx.changed() => {
                        changed.ok()?;
                        tokio::time::sleep(DEBOUNCE).await;
                        self.rx.borrow_and_update();
                    }
                    () = tokio::time::sleep(Duration::from_secs(HEARTBEAT_SECS)) => {
                        return Some(Bytes::from_static(b"\n"));
                    }
                }
            }
            self.first = false;
            let generation = *self.rx.borrow();
            let encoded = self.server.encoded(&self.id, generation);
            if self.last.as_deref() == Some(encoded.version.as_str()) {
                continue;
            }
            self.server.registry.sent(
                &self.id.namespace,
                &self.id.pod,
                &encoded.version,
                encoded.policies.clone(),
            );
            self.server.metrics.pushes.fetch_add(1, Ordering::Relaxed);
            self.server.push_started(&self.id, &encoded.version);
            self.last = Some(encoded.version.clone());
            return Some(encoded.line.clone());
        }
    }
}

/// The upgraded, bidirectional stream: snapshots out, ACK lines in. The two
/// directions run as whole loops raced against each other (not per line), so
/// neither loses a wake-up; when either ends the connection is done.
async fn session<IO: AsyncRead + AsyncWrite>(io: IO, mut st: StreamState) {
    let (read, mut write) = tokio::io::split(io);
    let (server, id) = (Arc::clone(&st.server), st.id.clone());
    let writer = async move {
        while let Some(line) = st.next_line().await {
            if write.write_all(&line).await.is_err() || write.flush().await.is_err() {
                break;
            }
        }
    };
    let reader = async move {
        // ACK lines are short: a small buffer keeps thousands of idle streams cheap.
        let mut reader = tokio::io::BufReader::with_capacity(1024, read);
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut reader)
                .take(MAX_ACK_BYTES as u64)
                .read_until(b'\n', &mut line)
                .await
            {
                Ok(0) | Err(_) => break,
                Ok(_) if !line.ends_with(b"\n") => {
                    tracing::warn!(namespace = %id.namespace, pod = %id.pod, "over-long or truncated ACK line; closing");
                    break;
                }
                Ok(_) => {}
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Ack>(&line) {
                Ok(ack) => server.record_ack(&id, &ack),
                Err(e) => {
                    tracing::warn!(namespace = %id.namespace, pod = %id.pod, error = %e, "invalid ACK line; closing");
                    break;
                }
            }
        }
    };
    tokio::select! {
        () = writer => {}
        () = reader => {}
    }
}

fn policies_of(s: &Snapshot) -> HashMap<String, i64> {
    s.policies
        .iter()
        .map(|p| (format!("{}/{}", p.namespace, p.name), p.generation))
        .collect()
}

fn text(status: StatusCode, body: &str) -> Response<PushBody> {
    let mut r = Response::new(BodyExt::boxed(Full::new(Bytes::from(body.to_string()))));
    *r.status_mut() = status;
    r
}
