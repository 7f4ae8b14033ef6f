//! The listeners: the outbound proxy (HTTP/1.1 and h2c, told apart by their
//! first bytes in [`sniff`]), the transparent listener for captured
//! connections ([`transparent`]), both with the graceful drain of [`drain`]
//! on shutdown, and the admin endpoint ([`admin`]); each listener holds at
//! most its cap of connections ([`cap`]).

pub(crate) mod admin;
mod cap;
pub(crate) mod drain;
mod h2c;
mod http1;
mod request_box;
mod sniff;
mod transparent;
mod tunnel;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt;
use http::header::{HeaderValue, CONNECTION};
use http::{Method, Request, Response, StatusCode, Version};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub use self::admin::{
    metrics_text, serve_admin, serve_admin_with, Admin, AdminLimits, LogLevelSetter,
    ADMIN_MAX_CONNECTIONS,
};
use self::cap::Slot;
use self::drain::{reached, ConnDrain, Drain, DrainPhase, ServedBody, SideWake};
use self::h2c::H2cConnection;
use self::sniff::{tunnelled, Protocol};
use self::transparent::OwnListeners;
use crate::clock;
use crate::exchange::body::ClientBody;
use crate::observe::metrics::Listener;
use crate::proxy::route::Destination;
use crate::proxy::tunnel::upgrade::Stream;
use crate::proxy::tunnel::OpenTunnel;
use crate::proxy::Proxy;

/// How long a new connection may stay silent before its first bytes, and then
/// how long a client gets to send each whole HTTP/1 request head (request line
/// and headers), counted from the connection's start or its previous
/// response's end (so an idle keep-alive connection closes after it too);
/// past it the connection is closed without an answer, so a slow or silent
/// client cannot hold a connection open indefinitely.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long, after the drain starts, an idle HTTP/1 keep-alive connection (or
/// an accepted one that has not spoken yet) stays open; for a connection
/// whose last response was still streaming at the signal, counted from that
/// response's end. Its client could not know about the drain (its last
/// response carried no `Connection: close`), so a request it sends in this
/// window is still answered, with `Connection: close`; one second covers a
/// request already on the wire plus a client's usual pause between requests
/// without holding shutdown up for long. Connections still quiet after it are
/// closed. A request that arrives just as they close can still be lost: the
/// window narrows that race, it cannot end it.
pub const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// How long a captured connection (or a CONNECT tunnel) is awaited to speak
/// first before it is taken for a server-first protocol and relayed
/// opaquely: HTTP and gRPC clients write as soon as they connect, so half a
/// second only delays a MySQL or SMTP greeting, once per connection.
pub const FIRST_BYTES_WAIT: Duration = Duration::from_millis(500);

/// Most connections taken from the listen backlog when the drain starts (the
/// kernel's default `somaxconn` is 4096; one burst of clients is what matters).
const MAX_BACKLOG_ON_DRAIN: usize = 4096;

/// The listeners [`serve`] accepts on.
#[derive(Debug)]
pub struct Listeners {
    /// The explicit proxy (`HTTP_PROXY`, or clients addressing it directly).
    pub proxy: TcpListener,
    /// Transparent listeners for redirected connections (IPv4 and IPv6).
    pub transparent: Vec<TcpListener>,
    /// Every other address this process listens on (admin, health): no
    /// captured connection may lead back to one of them.
    pub others: Vec<SocketAddr>,
}

/// Serves the proxy on `listener` until `shutdown` resolves; see [`serve`].
pub async fn serve_proxy(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) -> bool {
    let listeners = Listeners {
        proxy: listener,
        transparent: Vec::new(),
        others: Vec::new(),
    };
    serve(listeners, proxy, shutdown).await
}

/// Serves the proxy and transparent listeners until `shutdown` resolves,
/// then drains (see [`drain`]): stops accepting, sends `Connection: close` on
/// every HTTP/1 response and GOAWAY on HTTP/2, closes quiet HTTP/1
/// connections after [`DRAIN_IDLE_GRACE`] (at most half the drain timeout).
/// Requests in flight, tunnels, opaque relays and upgraded connections get up
/// to the configured drain timeout. Returns true when all of them finished
/// within it.
pub async fn serve(
    listeners: Listeners,
    proxy: Arc<Proxy>,
    shutdown: impl Future<Output = ()>,
) -> bool {
    // Responses' `date` comes from a cache refreshed while this serves.
    let _date = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(clock::keep_date()));
    let max_head = proxy.config().proxy.max_request_header_bytes;
    let builder = Arc::new(HttpBuilders::new(max_head));
    let mut own: Vec<SocketAddr> = listeners.others.clone();
    own.extend(
        std::iter::once(&listeners.proxy)
            .chain(&listeners.transparent)
            .filter_map(|l| l.local_addr().ok()),
    );
    // No name may resolve to these either (routes built before are built
    // again without them).
    proxy.dns.set_own_listeners(own.clone());
    if proxy.config().upstreams.iter().any(|u| !u.dns.is_empty()) {
        proxy.rebuild_routes();
    }
    let own = Arc::new(OwnListeners(own));
    // Index 0 is the proxy listener, the others are transparent.
    let all: Vec<TcpListener> = std::iter::once(listeners.proxy)
        .chain(listeners.transparent)
        .collect();
    let spawn = |i: usize, stream: TcpStream, drain_rx: &watch::Receiver<Drain>| {
        let listener = if i == 0 {
            Listener::Proxy
        } else {
            Listener::Transparent
        };
        // Read for each connection, so that a reload's cap applies to the next.
        let cap = proxy.config().proxy.max_connections;
        // Over the cap: reset and counted, then dropped here.
        let Some(slot) = Slot::take(&proxy, listener, cap, &stream) else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let (proxy, builder, drain) = (Arc::clone(&proxy), Arc::clone(&builder), drain_rx.clone());
        if i == 0 {
            tokio::spawn(serve_connection(stream, proxy, builder, drain, slot));
        } else {
            tokio::spawn(transparent::serve_captured(
                stream,
                proxy,
                builder,
                drain,
                Arc::clone(&own),
                slot,
            ));
        }
    };
    // Every connection task holds a receiver, so `drain.closed()` also tells
    // when the last connection has finished.
    let (drain, drain_rx) = watch::channel(Drain::SERVING);
    tokio::pin!(shutdown);
    loop {
        let accept = std::future::poll_fn(|cx| {
            for (i, l) in all.iter().enumerate() {
                if let Poll::Ready(r) = l.poll_accept(cx) {
                    return Poll::Ready((i, r));
                }
            }
            Poll::Pending
        });
        tokio::select! {
            (i, accepted) = accept => {
                match accepted {
                    Ok((stream, _)) => spawn(i, stream, &drain_rx),
                    Err(e) => {
                        // Out of file descriptors and similar: back off briefly, keep serving.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            () = &mut shutdown => break,
        }
    }
    // First, so that every response from now on carries `Connection: close`.
    proxy.start_draining();
    // Connections the kernel has completed but this loop has not accepted yet
    // would be reset when the listener closes, their requests lost: take them
    // in (at most a backlog's worth per listener) and serve them like the others.
    for (i, l) in all.iter().enumerate() {
        for _ in 0..MAX_BACKLOG_ON_DRAIN {
            match l.accept().now_or_never() {
                Some(Ok((stream, _))) => spawn(i, stream, &drain_rx),
                _ => break,
            }
        }
    }
    drop(all);
    drop(drain_rx);
    let timeout = proxy.config().proxy.drain_timeout;
    let grace = DRAIN_IDLE_GRACE.min(timeout / 2);
    let _ = drain.send(Drain {
        phase: DrainPhase::Draining,
        started_ms: clock::now_ms(),
        grace,
    });
    let finished = async {
        tokio::select! {
            () = drain.closed() => {}
            () = tokio::time::sleep(grace) => {
                drain.send_modify(|d| d.phase = DrainPhase::ClosingIdle);
                drain.closed().await;
            }
        }
        proxy.tunnels().idle().await;
    };
    tokio::time::timeout(timeout, finished).await.is_ok()
}

/// Serves one connection accepted on the proxy listener, following the
/// drain; `_slot` is its place under the listener's cap, held to its end.
async fn serve_connection(
    stream: TcpStream,
    proxy: Arc<Proxy>,
    builder: Arc<HttpBuilders>,
    mut drain: watch::Receiver<Drain>,
    _slot: Slot,
) {
    // Biased: a client whose bytes are already here is served even if the
    // drain has started; a silent one gets the grace window, then is dropped.
    let protocol = tokio::select! {
        biased;
        detected = sniff::detect(&stream) => match detected {
            Some(p) => p,
            None => return,
        },
        () = reached(&mut drain, DrainPhase::ClosingIdle) => return,
    };
    serve_http(stream, protocol, Destination::Host, proxy, builder, drain).await;
}

/// Serves HTTP on a connection whose `protocol` is known, each request
/// routed as `dest` says, following the drain.
async fn serve_http(
    stream: TcpStream,
    protocol: Protocol,
    dest: Destination,
    proxy: Arc<Proxy>,
    builder: Arc<HttpBuilders>,
    drain: watch::Receiver<Drain>,
) {
    let io = crate::socket::Socket::new(stream);
    serve_io(io, protocol, dest, proxy, builder, drain).await;
}

/// Serves the HTTP a CONNECT tunnel carries (`protocol`, told by its first
/// bytes), each request routed as `dest` says, with the listener's servers,
/// limits and header read timeout. It does not follow the drain: the drain
/// waits for an open tunnel, up to its timeout, as for any other.
async fn serve_tunnelled<T: Stream>(
    io: T,
    protocol: Protocol,
    dest: Destination,
    proxy: Arc<Proxy>,
) {
    let builder = Arc::new(HttpBuilders::new(
        proxy.config().proxy.max_request_header_bytes,
    ));
    // A drain that never starts: its sender lives as long as the tunnel.
    let (_serving, drain) = watch::channel(Drain::SERVING);
    serve_io(io, protocol, dest, proxy, builder, drain).await;
}

/// [`serve_http`] on any byte stream.
async fn serve_io<T: Stream>(
    io: T,
    protocol: Protocol,
    dest: Destination,
    proxy: Arc<Proxy>,
    builder: Arc<HttpBuilders>,
    drain: watch::Receiver<Drain>,
) {
    // h2c: the h2 crate's server directly (see [`h2c`]). Boxed: HTTP/2's
    // connection state is larger than HTTP/1's, and inline it would size
    // every connection's task, HTTP/1 ones included, for the rarer protocol.
    // Its streams are counted as HTTP/1's requests are, so that one with
    // none open for HEADER_READ_TIMEOUT gets GOAWAY: an idle or silent h2c
    // client holds a connection no longer than an HTTP/1 one.
    if protocol == Protocol::H2c {
        let streams = Arc::new(ConnDrain::new());
        let mut conn = Box::pin(H2cConnection::new(
            io,
            &builder.h2,
            proxy,
            dest,
            Arc::clone(&streams),
        ));
        let watched = Watched::H2c(streams);
        if let Err(e) = drive(conn.as_mut(), |c| c.graceful_shutdown(), drain, watched).await {
            tracing::debug!(error = %e, "client connection ended with an error");
        }
        return;
    }
    // HTTP/1: the sidecar's own server (see [`http1`]). The connection is
    // pinned here and [`drive`] borrows it: passed by value, it would be
    // stored twice in the task (once as drive's argument, once where drive
    // pins it).
    let conn_drain = Arc::new(ConnDrain::new());
    let conn = std::pin::pin!(http1::serve(
        io,
        proxy,
        dest,
        Arc::clone(&conn_drain),
        builder.max_head,
    ));
    let closing = Arc::clone(&conn_drain);
    let watched = Watched::Http1(conn_drain);
    if let Err(e) = drive(conn, move |_| closing.close(), drain, watched).await {
        tracing::debug!(error = %e, "client connection ended with an error");
    }
}

/// The servers' settings for the two protocols the sniff tells apart.
pub(crate) struct HttpBuilders {
    /// HTTP/1 request heads up to this many bytes (at least 8 KiB, the
    /// first read of a connection).
    max_head: usize,
    h2: h2::server::Builder,
}

impl HttpBuilders {
    /// Request heads up to `max_head` bytes (HPACK's list size on HTTP/2).
    fn new(max_head: usize) -> Self {
        Self {
            max_head: max_head.max(8192),
            h2: h2c::builder(max_head),
        }
    }
}

/// A served connection's open requests (HTTP/1) or streams (h2c), which
/// tell when it has been idle.
enum Watched {
    Http1(Arc<ConnDrain>),
    H2c(Arc<ConnDrain>),
}

/// Drives one served connection to its end, following the drain: `shutdown`
/// is the connection's graceful shutdown (GOAWAY on HTTP/2, close after the
/// response in flight on HTTP/1).
async fn drive<C, E>(
    mut conn: std::pin::Pin<&mut C>,
    shutdown: impl FnOnce(std::pin::Pin<&mut C>),
    mut drain: watch::Receiver<Drain>,
    watched: Watched,
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    // HTTP/2's GOAWAY lets streams in flight finish and tells the client
    // exactly which were not processed, so it goes out at once; HTTP/1 has no
    // such signal for an idle connection, hence the wait for a quiet one.
    // The wait for quiet (a timer and a notification) is boxed once the
    // drain starts, so that every connection's task is not sized for the
    // last second of the process (only the signal wait stays; measured:
    // `e2e/bench/results/2026-12-02-issue18-task-and-lto.md`).
    let quiet = async {
        reached(&mut drain, DrainPhase::Draining).await;
        if let Watched::Http1(c) = &watched {
            let d = *drain.borrow();
            Box::pin(c.quiet(d.started_ms, d.grace)).await;
        }
    };
    // A client gets HEADER_READ_TIMEOUT from the connection's start or its
    // last response's end to send a whole request head (HTTP/1) or open a
    // stream (h2c); past it an HTTP/1 connection closes without an answer
    // (there is no request to answer), an h2c one with GOAWAY.
    let idle = async {
        match &watched {
            Watched::Http1(c) | Watched::H2c(c) => c.idle(HEADER_READ_TIMEOUT).await,
        }
    };
    tokio::pin!(quiet, idle);
    // The connection is polled first, before any shutdown, which would
    // otherwise cancel it while hyper is still reading its preface. The
    // drain and the idle deadline are polled only when their own wakers
    // fired: a select would poll both on each of the two or three wakes a
    // proxied request gives the connection (measured:
    // `e2e/bench/results/2026-12-02-issue18-attempt-head.md`).
    let side = SideWake::new();
    let exit = std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = conn.as_mut().poll(cx) {
            return Poll::Ready(Exit::Done(result));
        }
        side.poll_fired(cx, |cx| {
            if quiet.as_mut().poll(cx).is_ready() {
                Poll::Ready(Exit::Quiet)
            } else if idle.as_mut().poll(cx).is_ready() {
                Poll::Ready(Exit::Idle)
            } else {
                Poll::Pending
            }
        })
    })
    .await;
    match exit {
        Exit::Done(result) => result,
        Exit::Quiet => {
            // Closes an idle HTTP/1 connection now and a busy one after its
            // response; sends GOAWAY on HTTP/2.
            shutdown(conn.as_mut());
            conn.await
        }
        Exit::Idle => match watched {
            Watched::Http1(_) => {
                tracing::debug!("no whole request head within the header read timeout: closing");
                Ok(())
            }
            Watched::H2c(_) => {
                tracing::debug!("no h2c stream within the header read timeout: GOAWAY");
                shutdown(conn.as_mut());
                conn.await
            }
        },
    }
}

/// Why [`drive`] stopped waiting.
enum Exit<E> {
    Done(Result<(), E>),
    Quiet,
    Idle,
}

/// Handles one request; while draining, an HTTP/1 response also carries
/// `Connection: close`, after which the connection closes, so the client
/// opens its next request on a new connection (to a pod that is not leaving).
///
/// Not an async fn: one would keep its own copy of `req` beside the
/// request's future for as long as it runs, and move all of that future
/// into itself when it starts; a mapped future holds only it (measured:
/// `e2e/bench/results/2026-12-03-issue18-own-server.md`).
fn serve_request(
    proxy: Arc<Proxy>,
    req: Request<ClientBody>,
    dest: Destination,
    conn: Option<&Arc<ConnDrain>>,
) -> impl Future<Output = Result<Response<ServedBody>, Infallible>> + Send {
    let end = conn.map(ConnDrain::request);
    let http1 = req.version() <= Version::HTTP_11;
    let connect = req.method() == Method::CONNECT;
    Arc::clone(&proxy)
        .handle_routed(req, dest)
        .map(move |response| {
            let Ok(mut response) = response;
            // An answered CONNECT: its tunnel is carried once the answer is out.
            if connect {
                if let Some(open) = OpenTunnel::take(&mut response) {
                    tunnel::spawn(open, Arc::clone(&proxy));
                }
            }
            // An upgrade or an established tunnel takes over the connection:
            // it must not be told to close. HTTP/2 has no Connection header
            // (RFC 9113 §8.2.2).
            let takes_over = response.status() == StatusCode::SWITCHING_PROTOCOLS
                || (connect && response.status().is_success());
            if http1 && !takes_over && proxy.is_draining() {
                response
                    .headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response.map(|body| ServedBody::new(body, end)))
        })
}
