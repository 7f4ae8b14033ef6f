//! One scriptable, fault-injecting upstream server on loopback.
//!
//! Contract: an [`Upstream`] listens on one port. For every request it reads
//! in full (HTTP/1.1 with Content-Length or chunked bodies, any number on a
//! keep-alive connection; or h2c, see below), it records a [`Received`],
//! asks its script (`Fn(&Received) -> Action`) what to do, and does it:
//! answer, echo, wait, stall past a timeout, abort mid-body, reset, close or
//! half-close. HTTP/1.1 is spoken on the raw socket, so the faults are real
//! TCP events (RST, FIN, a head without its body). A connection that opens
//! with the HTTP/2 preface is served by hyper's HTTP/2 server (h2c, prior
//! knowledge) with the same script; there a fault that would end the
//! connection resets the stream instead.
//!
//! Every request is recorded before it is acted on, with what the script
//! chose, and marked [`Received::answered`] once its whole answer was
//! written. [`Upstream::close`] shuts the listener and every connection (a
//! killed process: requests in flight are cut); [`Upstream::reopen`] listens
//! again on the same port. Dropping the upstream closes it.
//!
//! Bounds: a connection idle for [`IDLE`] is closed; the accept loop, the
//! requests per connection and every wait are bounded.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub use self::action::{first_then, Action, ActionKind};
pub use self::record::{digest, Deliveries, Received};

mod action;
mod h1;
mod h2;
mod record;

/// A connection with no request for this long is closed.
pub const IDLE: Duration = Duration::from_secs(120);
/// How long [`Action::HalfClose`] keeps reading after its FIN.
pub const HALF_CLOSE_WAIT: Duration = Duration::from_secs(5);
/// [`Action::AbortMidBody`]: the Content-Length announced, the bytes actually
/// sent, and the pause before the reset (so the head is forwarded first).
pub const ABORT_LENGTH: usize = 4096;
/// See [`ABORT_LENGTH`].
pub const ABORT_PARTIAL: &[u8] = b"partial body, then a reset";
/// See [`ABORT_LENGTH`].
pub const ABORT_PAUSE: Duration = Duration::from_millis(20);
const MAX_REQUESTS_PER_CONN: usize = 1_000_000;
const MAX_ACCEPTS: usize = 10_000_000;
const REBIND_TRIES: usize = 50;
const REBIND_PAUSE: Duration = Duration::from_millis(100);
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

type Script = Arc<dyn Fn(&Received) -> Action + Send + Sync>;

/// Settings of an upstream before it starts.
#[derive(Clone, Debug)]
pub struct Builder {
    bind: SocketAddr,
    keep_bodies: bool,
    ids: Option<(String, Deliveries)>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            keep_bodies: true,
            ids: None,
        }
    }
}

impl Builder {
    field_setters! {
        /// Listens on this (loopback) address instead of an ephemeral port on 127.0.0.1.
        bind: SocketAddr,
        /// Whether [`Received::body`] keeps the body (default true). A long
        /// run turns this off; the length and digest are always recorded.
        keep_bodies: bool,
    }

    /// Counts requests by the value of `header` in `deliveries`.
    pub fn count_ids(mut self, header: &str, deliveries: &Deliveries) -> Self {
        self.ids = Some((header.to_ascii_lowercase(), deliveries.clone()));
        self
    }

    /// Starts the upstream with `script`.
    pub async fn start(
        self,
        script: impl Fn(&Received) -> Action + Send + Sync + 'static,
    ) -> io::Result<Upstream> {
        let listener = TcpListener::bind(self.bind).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            addr,
            script: Arc::new(script),
            keep_bodies: self.keep_bodies,
            ids: self.ids,
            log: Mutex::default(),
            seq: AtomicUsize::new(0),
            accepted: AtomicU64::new(0),
            tasks: Mutex::default(),
        });
        listen(&inner, listener);
        Ok(Upstream {
            addr,
            inner: Some(inner),
        })
    }
}

/// A running upstream.
pub struct Upstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// `None` for [`Upstream::refusing`].
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("addr", &self.addr)
            .field("received", &self.count())
            .finish()
    }
}

#[derive(Default)]
struct Tasks {
    accept: Option<AbortHandle>,
    conns: Vec<AbortHandle>,
}

struct Inner {
    addr: SocketAddr,
    script: Script,
    keep_bodies: bool,
    ids: Option<(String, Deliveries)>,
    log: Mutex<Vec<Received>>,
    seq: AtomicUsize,
    accepted: AtomicU64,
    tasks: Mutex<Tasks>,
}

impl Upstream {
    /// Settings for a new upstream.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Starts an upstream on an ephemeral loopback port that does
    /// `script(request)` with each request.
    pub async fn start(script: impl Fn(&Received) -> Action + Send + Sync + 'static) -> Upstream {
        Upstream::builder()
            .start(script)
            .await
            .expect("bind an upstream on 127.0.0.1")
    }

    /// An upstream that does `action` with every request.
    pub async fn always(action: Action) -> Upstream {
        Upstream::start(move |_| action.clone()).await
    }

    /// A port where nothing listens: connections are refused.
    pub async fn refusing() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        Upstream { addr, inner: None }
    }

    /// Requests received so far.
    pub fn count(&self) -> usize {
        self.inner.as_ref().map_or(0, |i| lock(&i.log).len())
    }

    /// Requests received so far, in the order they were recorded.
    pub fn received(&self) -> Vec<Received> {
        self.inner
            .as_ref()
            .map_or_else(Vec::new, |i| lock(&i.log).clone())
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |i| i.accepted.load(Ordering::Relaxed))
    }

    /// True while it listens.
    pub fn is_open(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| lock(&i.tasks).accept.is_some())
    }

    /// Closes the listener and every connection, like a killed process:
    /// requests in flight get no (or a cut) answer.
    pub fn close(&self) {
        let Some(inner) = &self.inner else { return };
        let mut tasks = lock(&inner.tasks);
        if let Some(accept) = tasks.accept.take() {
            accept.abort();
        }
        for conn in tasks.conns.drain(..) {
            conn.abort();
        }
    }

    /// Listens again on the same port (retrying while the old socket lets go).
    pub async fn reopen(&self) -> io::Result<()> {
        let Some(inner) = &self.inner else {
            return Err(io::Error::other("a refusing upstream never listens"));
        };
        if self.is_open() {
            return Ok(());
        }
        let mut last = None;
        for _ in 0..REBIND_TRIES {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => {
                    listen(inner, listener);
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(REBIND_PAUSE).await;
        }
        Err(last.unwrap_or_else(|| io::Error::other("cannot listen again")))
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.close();
    }
}

fn listen(inner: &Arc<Inner>, listener: TcpListener) {
    let me = Arc::clone(inner);
    let task = tokio::spawn(async move {
        for _ in 0..MAX_ACCEPTS {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of descriptors, say: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            me.accepted.fetch_add(1, Ordering::Relaxed);
            let _ = stream.set_nodelay(true);
            let conn = tokio::spawn(serve(Arc::clone(&me), stream));
            let mut tasks = lock(&me.tasks);
            tasks.conns.retain(|h| !h.is_finished());
            tasks.conns.push(conn.abort_handle());
        }
    });
    lock(&inner.tasks).accept = Some(task.abort_handle());
}

impl Inner {
    /// Records `r` (body `body`), asks the script, records its choice; returns
    /// the record's index and the action.
    fn take(&self, mut r: Received, body: &[u8]) -> (usize, Action) {
        r.seq = self.seq.fetch_add(1, Ordering::SeqCst);
        r.attempt = r
            .header("x-reprise-attempt")
            .and_then(|v| v.trim().parse().ok());
        r.body_len = body.len();
        r.body_digest = digest(body);
        if self.keep_bodies {
            r.body = body.to_vec();
        }
        if let Some((name, deliveries)) = &self.ids {
            r.id = r.header(name).map(str::to_string);
            if let Some(id) = &r.id {
                deliveries.add(id);
            }
        }
        let action = (self.script)(&r);
        r.action = Some(action.kind());
        let mut log = lock(&self.log);
        log.push(r);
        (log.len() - 1, action)
    }

    fn answered(&self, idx: usize) {
        if let Some(r) = lock(&self.log).get_mut(idx) {
            r.answered = true;
        }
    }

    fn default_body(&self) -> Bytes {
        Bytes::from(format!("from {}\n", self.addr.port()))
    }
}

fn received(
    version: http::Version,
    method: String,
    path: String,
    headers: Vec<(String, String)>,
) -> Received {
    Received {
        seq: 0,
        at: Instant::now(),
        version,
        method,
        path,
        authority: None,
        headers,
        attempt: None,
        id: None,
        body: Vec::new(),
        body_len: 0,
        body_digest: 0,
        action: None,
        answered: false,
    }
}

async fn serve(inner: Arc<Inner>, stream: TcpStream) {
    if opens_with_preface(&stream).await {
        h2::serve_h2(inner, stream).await;
    } else {
        h1::serve_h1(inner, stream).await;
    }
}

/// True when the first bytes are the HTTP/2 connection preface.
async fn opens_with_preface(stream: &TcpStream) -> bool {
    let mut buf = [0u8; PREFACE.len()];
    // A partial preface is peeked again after a pause; 200 pauses is 1 s.
    for _ in 0..200 {
        let n = match tokio::time::timeout(IDLE, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        if n == 0 || buf[..n] != PREFACE[..n] {
            return false;
        }
        if n == PREFACE.len() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}
