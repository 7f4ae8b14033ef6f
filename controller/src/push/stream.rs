//! One sidecar's snapshot stream (`docs/src/concepts/controller.md`): the current
//! snapshot first, then, each time its group's snapshot changes, the new one
//! (or, to a sidecar that takes deltas on the upgraded stream, what changed
//! since the version it last received), a heartbeat line when nothing
//! changed. Upgraded to `reprise-push/1`, the same connection carries the
//! ACK, traffic and resync lines back; otherwise the snapshots are a
//! streamed response body and ACKs come as `POST /v1/acks`. Either way the sidecar counts as
//! connected exactly as long as its [`Registration`] lives, so a stream
//! dropped at any point (closed, reset, its task aborted) leaves no count and
//! no registry entry behind.
//!
//! A stream costs what its sidecar may make it cost, and no more: one
//! stream per pod (a reconnect closes the older one); lines read at a pace
//! ([`StreamLimits`](super::server::StreamLimits): past it the stream is
//! not read, and TCP holds the sidecar back); an ACK, NACK or resync only
//! in answer to a push (others are read past and counted), a resync's whole
//! snapshot at most once an interval, NACKs logged at a pace and cut.

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
use crate::metrics::{Counter, Labelled};
use crate::sidecars::Closer;

/// ACK lines are short: a small read buffer keeps thousands of idle streams cheap.
const ACK_READ_BUFFER: usize = 1024;

/// Longest part of a NACK's (or a resync's) message a log line carries.
pub(super) const NACK_LOGGED_BYTES: usize = 512;

/// A connected sidecar. While it lives, the sidecar is in the registry (and
/// counted in `reprise_controller_connected_sidecars`); dropping it
/// disconnects the sidecar, tells the reconciler which policies' sync counts
/// changed, and ends a push span still awaiting its ACK.
pub(super) struct Registration {
    server: Arc<PushServer>,
    namespace: String,
    pod: String,
    connection: u64,
    /// Ends this stream when a newer one of the pod replaces it.
    closer: Closer,
}

impl Registration {
    /// Registers `id`, replacing (and closing) an older stream of the pod.
    fn new(server: &Arc<PushServer>, id: &Identity) -> Self {
        let connection = server.next_connection();
        let closer = server.registry.connect(
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
            closer,
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
        closer: registration.closer.clone(),
        server,
        id,
        last,
        snapshots,
        first: true,
        upgraded: upgrade,
        sidecar: Arc::default(),
        resync_due: None,
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
    /// ACKs come on this stream (upgraded), so pushes wait for them.
    upgraded: bool,
    /// What the reading half heard: answers, requests for the whole snapshot.
    sidecar: Arc<Heard>,
    /// Ends the stream (a newer stream of the pod replaced it).
    closer: Closer,
    /// The soonest the next resync's whole snapshot goes out.
    resync_due: Option<tokio::time::Instant>,
    /// Keeps the group alive while the stream is.
    _group: Arc<Group>,
    _registration: Registration,
}

/// What the reading half of an upgraded stream tells the writing half.
///
/// One push at a time: after a line, the writer waits for the sidecar's
/// answer (ACK, NACK or resync) before the next, and then sends what is
/// current, a delta from what the sidecar answered. Changes that came
/// meanwhile are one push, however many there were: a slow sidecar is
/// never behind a queue of lines in its socket buffer (as xDS servers wait
/// for the ACK of a type before pushing it again).
#[derive(Default)]
struct Heard {
    /// The sidecar asked for the whole snapshot again.
    resync: std::sync::atomic::AtomicBool,
    /// A push awaits its answer.
    awaiting: std::sync::atomic::AtomicBool,
    wake: tokio::sync::Notify,
}

impl Heard {
    /// The sidecar answered the push (and perhaps asked for a resync).
    fn answered(&self, resync: bool) {
        use std::sync::atomic::Ordering::Release;
        if resync {
            self.resync.store(true, Release);
        }
        self.awaiting.store(false, Release);
        self.wake.notify_one();
    }

    fn awaiting(&self) -> bool {
        self.awaiting.load(std::sync::atomic::Ordering::Acquire)
    }
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
            if self.closer.is_closed() {
                return None;
            }
            if !self.first {
                let awaiting = self.sidecar.awaiting();
                tokio::select! {
                    changed = self.snapshots.changed(), if !awaiting => changed.ok()?,
                    () = self.sidecar.wake.notified() => {}
                    () = self.closer.closed() => return None,
                    () = tokio::time::sleep(Duration::from_secs(HEARTBEAT_SECS)) => {
                        return Some(Bytes::from_static(b"\n"));
                    }
                }
            }
            self.first = false;
            if self.sidecar.awaiting() {
                continue;
            }
            if self
                .sidecar
                .resync
                .swap(false, std::sync::atomic::Ordering::AcqRel)
            {
                // A whole snapshot again, at most once an interval: a
                // sidecar answering every line with a resync would have
                // the controller encode and send whole snapshots in a loop.
                let now = tokio::time::Instant::now();
                if let Some(due) = self.resync_due.filter(|due| *due > now) {
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        () = self.closer.closed() => return None,
                    }
                }
                self.resync_due =
                    Some(tokio::time::Instant::now() + self.server.limits.resync_every);
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
            self.server.registry.pushed(
                &self.id.namespace,
                &self.id.pod,
                &current.version,
                (*current.policies).clone(),
                Some(line.clone()),
            );
            self.server.metrics.add(Counter::Pushes);
            self.server.push_started(&self.id, &current.version);
            self.last = Some(current);
            if self.upgraded {
                self.sidecar
                    .awaiting
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            return Some(line);
        }
    }
}

/// The upgraded, bidirectional stream: snapshots out, ACK lines in. The two
/// directions run as whole loops raced against each other (not per line), so
/// neither loses a wake-up; when either ends the connection is done.
async fn session<IO: AsyncRead + AsyncWrite>(io: IO, mut st: StreamState) {
    let (read, mut write) = tokio::io::split(io);
    let (server, id, sidecar, closer) = (
        Arc::clone(&st.server),
        st.id.clone(),
        Arc::clone(&st.sidecar),
        st.closer.clone(),
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
        let limits = server.limits;
        let mut due = tokio::time::Instant::now();
        loop {
            // The line pace: past it, this stream is not read until it allows.
            let slack = limits.line_every * limits.line_burst.saturating_sub(1);
            let now = tokio::time::Instant::now();
            if due > now + slack {
                tokio::time::sleep_until(due - slack).await;
            }
            due = due.max(tokio::time::Instant::now()) + limits.line_every;
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
            let unsolicited = || {
                server
                    .metrics
                    .count(Labelled::SidecarLinesIgnored, "unsolicited", 1);
            };
            match serde_json::from_slice::<SidecarLine>(&line) {
                // An answer only to a push that awaits one: the same ACK
                // ten thousand times is read past, not counted each time.
                Ok(SidecarLine::Ack(_) | SidecarLine::Resync { .. }) if !sidecar.awaiting() => {
                    unsolicited();
                }
                Ok(SidecarLine::Ack(ack)) => {
                    server.record_ack(&id, &ack);
                    sidecar.answered(false);
                }
                Ok(SidecarLine::Traffic(report)) => server.record_traffic(&id, report),
                Ok(SidecarLine::Resync { resync: r }) => {
                    if server
                        .nack_logs
                        .take(&(id.namespace.clone(), id.pod.clone()))
                    {
                        tracing::warn!(namespace = %id.namespace, pod = %id.pod, version = %crate::untrusted::logged(&r.version, 128), reason = %crate::untrusted::logged(&r.reason, NACK_LOGGED_BYTES), "a delta did not apply; sending the whole snapshot");
                    }
                    sidecar.answered(true);
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
        () = closer.closed() => {
            tracing::info!("a newer stream of the pod replaced this one: closed");
        }
    }
}
