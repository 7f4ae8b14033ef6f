//! One sidecar's snapshot stream (README: "Push protocol"): the current
//! snapshot first, then, each time its group's snapshot changes, the new one
//! (or, to a sidecar that takes deltas on the upgraded stream, what changed
//! since the version it last received), a heartbeat line when nothing
//! changed. Upgraded to `reprise-push/1`, the same connection carries the
//! ACK, traffic and resync lines back; otherwise the snapshots are a
//! streamed response body and ACKs come as `POST /v1/acks`. Either way the sidecar counts as
//! connected exactly as long as its [`Registration`] lives, so a stream
//! dropped at any point (closed, reset, its task aborted) leaves no count and
//! no registry entry behind.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use reprise_crds::protocol::{self, CAPABILITY_DELTA, HEARTBEAT_SECS, VERSION_PARAM};
use reprise_crds::traffic::{SidecarLine, CAPABILITY_TRAFFIC};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::auth::Identity;
use super::groups::{Group, Published};
use super::server::{PushBody, PushServer, MAX_ACK_BYTES};
use crate::metrics::Counter;

/// ACK lines are short: a small read buffer keeps thousands of idle streams cheap.
const ACK_READ_BUFFER: usize = 1024;

/// A connected sidecar. While it lives, the sidecar is in the registry (and
/// counted in `reprise_controller_connected_sidecars`); dropping it
/// disconnects the sidecar, tells the reconciler which policies' sync counts
/// changed, and ends a push span still awaiting its ACK.
pub(super) struct Registration {
    server: Arc<PushServer>,
    namespace: String,
    pod: String,
    connection: u64,
}

impl Registration {
    /// Registers `id` (replacing an older connection of the same pod).
    fn new(server: &Arc<PushServer>, id: &Identity) -> Self {
        let connection = server.next_connection();
        server.registry.connect(
            &id.namespace,
            &id.pod,
            id.labels.clone(),
            id.capabilities.clone(),
            connection,
        );
        Registration {
            server: Arc::clone(server),
            namespace: id.namespace.clone(),
            pod: id.pod.clone(),
            connection,
        }
    }
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

/// `GET /v1/snapshots` from the authenticated sidecar `id`: registers it and
/// answers with the stream (`101 Switching Protocols` when it asked for the
/// upgrade).
pub(super) fn open(
    server: Arc<PushServer>,
    id: Identity,
    mut req: Request<Incoming>,
) -> Response<PushBody> {
    let resume = req.uri().query().and_then(|q| {
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == VERSION_PARAM)
            .map(|(_, v)| v.to_string())
    });
    let registration = Registration::new(&server, &id);
    tracing::info!(namespace = %id.namespace, pod = %id.pod, resume = ?resume, "sidecar connected");
    let group = server.groups.join(&id, &*server.source);
    let mut snapshots = group.subscribe();
    let current = Arc::clone(&snapshots.borrow_and_update());
    // Resume: when the sidecar already runs the current version, it is in sync without a push.
    let mut last = None;
    if resume.as_deref() == Some(current.version.as_str()) {
        server.registry.sent(
            &id.namespace,
            &id.pod,
            &current.version,
            (*current.policies).clone(),
        );
        let touched = server
            .registry
            .ack(&id.namespace, &id.pod, &current.version)
            .unwrap_or_default();
        server.notify(touched);
        last = Some(current);
    }
    let upgrade = protocol::is_upgrade(req.headers());
    let state = StreamState {
        deltas: upgrade && id.capabilities.contains(CAPABILITY_DELTA),
        server,
        id,
        last,
        snapshots,
        first: true,
        resync: Arc::default(),
        _group: group,
        _registration: registration,
    };
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
        protocol::insert_upgrade_headers(response.headers_mut());
        // This replica reads traffic reports on the upgraded stream.
        response.headers_mut().insert(
            protocol::CAPABILITIES_HEADER,
            http::HeaderValue::from_static(CAPABILITY_TRAFFIC),
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

/// What one stream has sent and waits on.
struct StreamState {
    server: Arc<PushServer>,
    id: Identity,
    /// The snapshot last sent (or resumed): what a delta starts from.
    last: Option<Arc<Published>>,
    /// Its group's snapshots.
    snapshots: watch::Receiver<Arc<Published>>,
    /// The current snapshot is still to be sent.
    first: bool,
    /// Deltas may be sent (the sidecar takes them, on the upgraded stream).
    deltas: bool,
    /// Set when the sidecar asked for the whole snapshot again.
    resync: Arc<Resync>,
    /// Keeps the group alive while the stream is.
    _group: Arc<Group>,
    _registration: Registration,
}

/// A sidecar's request for the whole snapshot, from the reading half of
/// the stream to the writing one.
#[derive(Default)]
struct Resync {
    asked: std::sync::atomic::AtomicBool,
    wake: tokio::sync::Notify,
}

async fn next_frame(
    mut st: StreamState,
) -> Option<(Result<Frame<Bytes>, Infallible>, StreamState)> {
    let line = st.next_line().await?;
    st.server
        .metrics
        .add_n(Counter::PushBytes, line.len() as u64);
    Some((Ok(Frame::data(line)), st))
}

impl StreamState {
    /// The next line to send: the snapshot (or the delta to it) when it
    /// changed, else a heartbeat. `None` when the group's publisher is gone.
    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if !self.first {
                tokio::select! {
                    changed = self.snapshots.changed() => changed.ok()?,
                    () = self.resync.wake.notified() => {}
                    () = tokio::time::sleep(Duration::from_secs(HEARTBEAT_SECS)) => {
                        return Some(Bytes::from_static(b"\n"));
                    }
                }
            }
            self.first = false;
            if self
                .resync
                .asked
                .swap(false, std::sync::atomic::Ordering::AcqRel)
            {
                self.last = None;
            }
            let current = Arc::clone(&self.snapshots.borrow_and_update());
            let line = match &self.last {
                Some(last) if last.version == current.version => continue,
                Some(last) if self.deltas => {
                    self.server.metrics.add(Counter::DeltaPushes);
                    current.delta_line(last)
                }
                _ => current.full_line(),
            };
            self.server.registry.sent(
                &self.id.namespace,
                &self.id.pod,
                &current.version,
                (*current.policies).clone(),
            );
            self.server.metrics.add(Counter::Pushes);
            self.server.push_started(&self.id, &current.version);
            self.last = Some(current);
            return Some(line);
        }
    }
}

/// The upgraded, bidirectional stream: snapshots out, ACK lines in. The two
/// directions run as whole loops raced against each other (not per line), so
/// neither loses a wake-up; when either ends the connection is done.
async fn session<IO: AsyncRead + AsyncWrite>(io: IO, mut st: StreamState) {
    let (read, mut write) = tokio::io::split(io);
    let (server, id, resync) = (
        Arc::clone(&st.server),
        st.id.clone(),
        Arc::clone(&st.resync),
    );
    let writer = async move {
        while let Some(line) = st.next_line().await {
            if write.write_all(&line).await.is_err() || write.flush().await.is_err() {
                break;
            }
            st.server
                .metrics
                .add_n(Counter::PushBytes, line.len() as u64);
        }
    };
    let reader = async move {
        let mut reader = tokio::io::BufReader::with_capacity(ACK_READ_BUFFER, read);
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
            match serde_json::from_slice::<SidecarLine>(&line) {
                Ok(SidecarLine::Ack(ack)) => server.record_ack(&id, &ack),
                Ok(SidecarLine::Traffic(report)) => server.record_traffic(&id, report),
                Ok(SidecarLine::Resync { resync: r }) => {
                    tracing::warn!(namespace = %id.namespace, pod = %id.pod, version = %r.version, reason = %r.reason, "a delta did not apply; sending the whole snapshot");
                    resync
                        .asked
                        .store(true, std::sync::atomic::Ordering::Release);
                    resync.wake.notify_one();
                }
                Err(e) => {
                    tracing::warn!(namespace = %id.namespace, pod = %id.pod, error = %e, "invalid ACK or traffic line; closing");
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
