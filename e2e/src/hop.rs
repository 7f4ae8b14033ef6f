//! One hop of a call chain, done the way an OpenTelemetry-instrumented
//! application does it (the e2e app's chain mode, `NEXT_HOP`): the request's
//! trace context and baggage are extracted with OpenTelemetry's own
//! propagators (`TraceContextPropagator`, `BaggagePropagator`) and injected
//! into a new request to the next hop, sent through the pod's sidecar
//! (`HTTP_PROXY`): HTTP/1.1 in absolute form, or h2c with the next hop as
//! `:authority` when the inbound request was HTTP/2 (gRPC included: its
//! body, `content-type` and `te` go along, its trailers come back).
//!
//! The outbound call lives inside the inbound request's handler and owns
//! its connection: when the inbound connection closes (or its HTTP/2
//! stream is reset) the server drops the handler, and with it the outbound
//! call and its connection, as real frameworks cancel a request's context.
//! [`Next::detached`] makes an application that does not: its call runs on
//! in a task of its own whatever becomes of the request.
//!
//! [`Counts`] says what a hop did, for `/stats`: requests started,
//! finished and cancelled, and the same for the calls it made; and, for the
//! chain measurement, each request that came with a `chain.request` entry
//! in its baggage (read with the same propagator): that id, the
//! `chain.sent_ms` the client wrote beside it, when it started and what it
//! was answered ([`Seen`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, HOST, TE};
use http::{Request, Response, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry::propagation::{TextMapCompositePropagator, TextMapPropagator};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

/// A response body: whole, with trailers when the next hop sent some.
pub type Body = BoxBody<Bytes, Infallible>;

/// Longest a hop waits for the next one (a client gives up long before).
const CALL_WITHIN: Duration = Duration::from_secs(120);

/// Requests [`Counts`] keeps at most in [`Counts::seen`].
const SEEN_AT_MOST: usize = 200_000;

/// One request a hop saw with a `chain.request` baggage entry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seen {
    /// The client's id of the request (`chain.request`).
    pub id: String,
    /// When the client sent it (`chain.sent_ms`, Unix ms), when it said.
    pub sent_ms: Option<u64>,
    /// When this hop began it (Unix ms).
    pub started_ms: u64,
    /// The status it was answered with, once answered.
    pub status: Option<u16>,
}

/// What a hop (or the last one) did so far.
#[derive(Debug, Default)]
pub struct Counts {
    /// Requests it began to handle.
    pub started: AtomicU64,
    /// Requests it answered.
    pub finished: AtomicU64,
    /// Requests dropped before they were answered (the caller went away).
    pub cancelled: AtomicU64,
    /// Calls it made to the next hop.
    pub calls: AtomicU64,
    /// Calls dropped before their answer came (cancelled with the request).
    pub calls_cancelled: AtomicU64,
    /// Requests that came with a `chain.request` id.
    pub seen: std::sync::Mutex<Vec<Seen>>,
}

impl Counts {
    /// The counts as JSON.
    pub fn json(&self) -> serde_json::Value {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "started": n(&self.started),
            "finished": n(&self.finished),
            "cancelled": n(&self.cancelled),
            "calls": n(&self.calls),
            "calls_cancelled": n(&self.calls_cancelled),
            "seen": serde_json::to_value(&*self.seen.lock().unwrap_or_else(|e| e.into_inner()))
                .unwrap_or_default(),
        })
    }

    /// Keeps a request whose baggage names it (`chain.request`); its index
    /// in [`Counts::seen`], for [`Counts::answered`].
    pub fn saw(&self, headers: &http::HeaderMap) -> Option<usize> {
        use opentelemetry::baggage::BaggageExt;
        let cx = BaggagePropagator::new().extract(&HeaderExtractor(headers));
        let baggage = cx.baggage();
        let id = baggage.get("chain.request")?.to_string();
        let sent_ms = baggage
            .get("chain.sent_ms")
            .and_then(|v| v.as_str().parse().ok());
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= SEEN_AT_MOST {
            return None;
        }
        seen.push(Seen {
            id,
            sent_ms,
            started_ms: now_ms(),
            status: None,
        });
        Some(seen.len() - 1)
    }

    /// The request [`Counts::saw`] kept at `index` was answered `status`.
    pub fn answered(&self, index: Option<usize>, status: u16) {
        let Some(i) = index else {
            return;
        };
        if let Some(s) = self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(i)
        {
            s.status = Some(status);
        }
    }

    /// Counts a request begun; the guard counts it finished, or cancelled
    /// when dropped first.
    pub fn request(&self) -> Guard<'_> {
        self.started.fetch_add(1, Ordering::Relaxed);
        Guard {
            finished: Some(&self.finished),
            dropped: &self.cancelled,
            over: false,
        }
    }

    /// Counts a call made; the guard counts it cancelled when dropped
    /// before it ended.
    fn call(&self) -> Guard<'_> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Guard {
            finished: None,
            dropped: &self.calls_cancelled,
            over: false,
        }
    }
}

/// Counts one request (or call) finished or cancelled, once.
#[derive(Debug)]
pub struct Guard<'a> {
    finished: Option<&'a AtomicU64>,
    dropped: &'a AtomicU64,
    over: bool,
}

impl Guard<'_> {
    /// It ended with an answer.
    pub fn finish(mut self) {
        if let Some(c) = self.finished {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.over = true;
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if !self.over {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Where a hop sends its calls.
#[derive(Clone, Debug)]
pub struct Next {
    /// The next hop's host (an upstream of the sidecar: a Service name).
    pub host: String,
    /// The pod's sidecar.
    pub sidecar: SocketAddr,
    /// Calls run on when their request goes away (an application that
    /// does not cancel).
    pub detached: bool,
}

/// The propagators an OpenTelemetry SDK installs by default
/// (`OTEL_PROPAGATORS=tracecontext,baggage`).
fn propagator() -> TextMapCompositePropagator {
    TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ])
}

/// Calls `next` for `req` and answers with what came back: its status,
/// `content-type`, body and trailers. A call that fails is `502`.
pub async fn forward(
    req: Request<Incoming>,
    next: &Next,
    counts: &std::sync::Arc<Counts>,
) -> Response<Body> {
    let answer = if next.detached {
        let (next, counts) = (next.clone(), std::sync::Arc::clone(counts));
        let task = tokio::spawn(async move {
            let call = counts.call();
            let answer = tokio::time::timeout(CALL_WITHIN, call_next(req, &next)).await;
            call.finish();
            answer
        });
        match task.await {
            Ok(answer) => answer,
            Err(e) => return text(502, format!("the call's task failed: {e}\n")),
        }
    } else {
        let call = counts.call();
        let answer = tokio::time::timeout(CALL_WITHIN, call_next(req, next)).await;
        // Reached only when the call ended: dropped with the handler, `call`
        // counts a cancellation.
        call.finish();
        answer
    };
    match answer {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => text(502, format!("next hop {}: {e}\n", next.host)),
        Err(_) => text(
            504,
            format!("next hop {}: no answer in {CALL_WITHIN:?}\n", next.host),
        ),
    }
}

/// The wall clock in Unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A plain-text answer.
pub fn text(status: u16, body: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

async fn call_next(req: Request<Incoming>, next: &Next) -> anyhow::Result<Response<Body>> {
    let (parts, body) = req.into_parts();
    let cx = propagator().extract(&HeaderExtractor(&parts.headers));
    let body = body.collect().await?.to_bytes();
    let http2 = parts.version == Version::HTTP_2;
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let uri = format!("http://{}{path}", next.host);
    let mut out = Request::builder()
        .method(parts.method.clone())
        .uri(&uri)
        .body(Full::new(body))?;
    let headers = out.headers_mut();
    if !http2 {
        headers.insert(HOST, HeaderValue::from_str(&next.host)?);
    }
    // What a gRPC client sets on its own call.
    for name in [CONTENT_TYPE, TE] {
        if let Some(v) = parts.headers.get(&name) {
            headers.insert(name, v.clone());
        }
    }
    propagator().inject_context(&cx, &mut HeaderInjector(headers));
    let stream = tokio::net::TcpStream::connect(next.sidecar).await?;
    let io = TokioIo::new(stream);
    // The connection is driven here, beside the call: dropped with the
    // handler, it closes.
    let (parts, collected) = if http2 {
        *out.version_mut() = Version::HTTP_2;
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        drive(conn, async move {
            let response = sender.send_request(out).await?;
            let (parts, body) = response.into_parts();
            Ok((parts, body.collect().await?))
        })
        .await?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        drive(conn, async move {
            let response = sender.send_request(out).await?;
            let (parts, body) = response.into_parts();
            Ok((parts, body.collect().await?))
        })
        .await?
    };
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    let mut frames = vec![Frame::data(data)];
    if let Some(t) = trailers {
        frames.push(Frame::trailers(t));
    }
    let body = StreamBody::new(futures_util::stream::iter(
        frames.into_iter().map(Ok::<_, Infallible>),
    ));
    let mut response = Response::new(body.boxed());
    *response.status_mut() = parts.status;
    for name in [CONTENT_TYPE] {
        if let Some(v) = parts.headers.get(&name) {
            response.headers_mut().insert(name, v.clone());
        }
    }
    // A Trailers-Only gRPC answer has its status in the headers.
    for (name, value) in &parts.headers {
        if name.as_str().starts_with("grpc-") || name.as_str() == "x-reprise-error" {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    Ok(response)
}

/// Runs `call` while driving `conn`, its connection; once the connection
/// ends, what `call` still has to read is already read.
async fn drive<C, T>(
    conn: C,
    call: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T>
where
    C: std::future::Future,
{
    tokio::pin!(conn, call);
    tokio::select! {
        biased;
        done = &mut call => done,
        _ = &mut conn => call.await,
    }
}
