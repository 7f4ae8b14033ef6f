//! A real gRPC server with fault modes, and a client, both tonic's (the gRPC
//! implementation in Reprise's dependency tree), for the sidecar's gRPC tests.
//!
//! The service is `reprise.test.Echo` with a unary `Say` and a
//! server-streaming `Stream` (three messages), both answering with the
//! request's text and the endpoint's name. What each call gets is scripted
//! per call number, like the HTTP [`crate::upstream`]: a normal answer, a
//! status as a Trailers-Only response (with an optional
//! `grpc-retry-pushback-ms`), a status in trailers after the headers but
//! before any message, a status after the first message, or a delay. Every
//! call's metadata is recorded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{self, BoxStream, StreamExt};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tonic::codegen::BoxFuture;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

/// The one message type, for requests and answers.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Echo {
    /// The text.
    #[prost(string, tag = "1")]
    pub text: String,
}

/// The unary method's path.
pub const SAY: &str = "/reprise.test.Echo/Say";
/// The server-streaming method's path.
pub const STREAM: &str = "/reprise.test.Echo/Stream";

/// What one call gets.
#[derive(Clone, Debug)]
pub enum GrpcAction {
    /// The answer (three messages for `Stream`).
    Ok,
    /// `code` as a Trailers-Only response, with `grpc-retry-pushback-ms`
    /// when given.
    TrailersOnly(Code, Option<&'static str>),
    /// Headers, then `code` in trailers before any message (a stream that
    /// fails before its first message).
    BeforeFirstMessage(Code),
    /// One message, then `code` in trailers (`Stream` only).
    AfterFirstMessage(Code),
    /// Waits, then does the inner action.
    Delay(Duration, Box<GrpcAction>),
}

/// One call as the server saw it.
#[derive(Clone, Debug)]
pub struct GrpcCall {
    /// The method path.
    pub path: String,
    /// Request metadata (lower-case names; binary ones left out).
    pub metadata: Vec<(String, String)>,
}

impl GrpcCall {
    /// The value of metadata `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

type Script = Arc<dyn Fn(usize) -> GrpcAction + Send + Sync>;

/// A running gRPC server on loopback.
#[derive(Clone)]
pub struct GrpcServer {
    /// Its address.
    pub addr: SocketAddr,
    name: String,
    calls: Arc<Mutex<Vec<GrpcCall>>>,
}

impl std::fmt::Debug for GrpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl GrpcServer {
    /// A server named `name` whose `n`th call (from 0) gets `script(n)`.
    pub async fn start(
        name: &str,
        script: impl Fn(usize) -> GrpcAction + Send + Sync + 'static,
    ) -> GrpcServer {
        GrpcServer::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), name, script).await
    }

    /// [`GrpcServer::start`] listening on `bind` (a network namespace's
    /// address, say) instead of an ephemeral loopback port.
    pub async fn start_on(
        bind: SocketAddr,
        name: &str,
        script: impl Fn(usize) -> GrpcAction + Send + Sync + 'static,
    ) -> GrpcServer {
        let listener = tokio::net::TcpListener::bind(bind)
            .await
            .unwrap_or_else(|e| panic!("bind the gRPC server on {bind}: {e}"));
        let addr = listener.local_addr().expect("its address");
        let server = GrpcServer {
            addr,
            name: name.to_string(),
            calls: Arc::default(),
        };
        let script: Script = Arc::new(script);
        let counter = Arc::new(AtomicUsize::new(0));
        let s = server.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (s, script, counter) = (s.clone(), Arc::clone(&script), Arc::clone(&counter));
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let n = counter.fetch_add(1, Ordering::SeqCst);
                        let (s, action) = (s.clone(), script(n));
                        async move { s.serve(req, action).await }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        server
    }

    /// A server that always answers.
    pub async fn healthy(name: &str) -> GrpcServer {
        GrpcServer::start(name, |_| GrpcAction::Ok).await
    }

    /// Calls received so far.
    pub fn calls(&self) -> Vec<GrpcCall> {
        self.calls.lock().expect("calls").clone()
    }

    /// How many calls it received.
    pub fn count(&self) -> usize {
        self.calls.lock().expect("calls").len()
    }

    async fn serve(
        &self,
        req: http::Request<Incoming>,
        action: GrpcAction,
    ) -> Result<http::Response<tonic::body::Body>, Infallible> {
        let path = req.uri().path().to_string();
        self.calls.lock().expect("calls").push(GrpcCall {
            path: path.clone(),
            metadata: req
                .headers()
                .iter()
                .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
                .collect(),
        });
        let mut action = action;
        while let GrpcAction::Delay(d, next) = action {
            tokio::time::sleep(d).await;
            action = *next;
        }
        let handler = Handler {
            name: self.name.clone(),
            action,
        };
        let mut grpc = tonic::server::Grpc::new(ProstCodec::<Echo, Echo>::default());
        Ok(match path.as_str() {
            STREAM => grpc.server_streaming(StreamHandler(handler), req).await,
            _ => grpc.unary(handler, req).await,
        })
    }
}

/// Answers one call as its action says.
#[derive(Clone)]
struct Handler {
    name: String,
    action: GrpcAction,
}

fn status(code: Code, pushback: Option<&str>) -> Status {
    let mut s = Status::new(code, format!("scripted {code:?}"));
    if let Some(ms) = pushback {
        if let Ok(v) = ms.parse() {
            s.metadata_mut().insert("grpc-retry-pushback-ms", v);
        }
    }
    s
}

impl tower_service::Service<tonic::Request<Echo>> for Handler {
    type Response = tonic::Response<Echo>;
    type Error = Status;
    type Future = BoxFuture<Self::Response, Status>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<Echo>) -> Self::Future {
        let text = format!("{} from {}", req.into_inner().text, self.name);
        let action = self.action.clone();
        Box::pin(async move {
            match action {
                GrpcAction::TrailersOnly(code, pushback) => Err(status(code, pushback)),
                GrpcAction::BeforeFirstMessage(code) | GrpcAction::AfterFirstMessage(code) => {
                    Err(status(code, None))
                }
                GrpcAction::Ok | GrpcAction::Delay(..) => Ok(tonic::Response::new(Echo { text })),
            }
        })
    }
}

/// The stream of a `Stream` call.
type Messages = BoxStream<'static, Result<Echo, Status>>;

/// Answers one `Stream` call as its action says.
struct StreamHandler(Handler);

impl tonic::server::ServerStreamingService<Echo> for StreamHandler {
    type Response = Echo;
    type ResponseStream = Messages;
    type Future = BoxFuture<tonic::Response<Messages>, Status>;

    fn call(&mut self, req: tonic::Request<Echo>) -> Self::Future {
        let text = format!("{} from {}", req.into_inner().text, self.0.name);
        let action = self.0.action.clone();
        Box::pin(async move {
            let message = |i: usize| {
                Ok(Echo {
                    text: format!("{text} #{i}"),
                })
            };
            let items: Messages = match action {
                GrpcAction::TrailersOnly(code, pushback) => return Err(status(code, pushback)),
                GrpcAction::BeforeFirstMessage(code) => {
                    stream::iter([Err(status(code, None))]).boxed()
                }
                GrpcAction::AfterFirstMessage(code) => {
                    stream::iter([message(1), Err(status(code, None))]).boxed()
                }
                GrpcAction::Ok | GrpcAction::Delay(..) => {
                    stream::iter((1..=3).map(message).collect::<Vec<_>>()).boxed()
                }
            };
            Ok(tonic::Response::new(items))
        })
    }
}

/// A client's channel to `addr` whose calls name `authority` (the
/// `:authority` the sidecar routes by).
pub async fn channel(addr: SocketAddr, authority: &str) -> tonic::transport::Channel {
    let origin: http::Uri = format!("http://{authority}").parse().expect("authority");
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .origin(origin)
        .connect()
        .await
        .expect("connect the gRPC channel")
}

/// Calls `Say` with `text` (and metadata `headers`) over `channel`.
pub async fn say(
    channel: &tonic::transport::Channel,
    text: &str,
    headers: &[(&'static str, &str)],
) -> Result<Echo, Status> {
    let mut client = tonic::client::Grpc::new(channel.clone());
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut req = tonic::Request::new(Echo {
        text: text.to_string(),
    });
    for (k, v) in headers {
        if let Ok(v) = v.parse() {
            req.metadata_mut().insert(*k, v);
        }
    }
    client
        .unary(
            req,
            http::uri::PathAndQuery::from_static(SAY),
            ProstCodec::<Echo, Echo>::default(),
        )
        .await
        .map(tonic::Response::into_inner)
}

/// Calls `Stream` with `text` over `channel`; the messages received before
/// the call ended, and how it ended.
pub async fn stream_call(
    channel: &tonic::transport::Channel,
    text: &str,
) -> (Vec<String>, Result<(), Status>) {
    let mut client = tonic::client::Grpc::new(channel.clone());
    if let Err(e) = client.ready().await {
        return (Vec::new(), Err(Status::unavailable(e.to_string())));
    }
    let req = tonic::Request::new(Echo {
        text: text.to_string(),
    });
    let mut messages = Vec::new();
    let mut stream = match client
        .server_streaming(
            req,
            http::uri::PathAndQuery::from_static(STREAM),
            ProstCodec::<Echo, Echo>::default(),
        )
        .await
    {
        Ok(r) => r.into_inner(),
        Err(s) => return (messages, Err(s)),
    };
    loop {
        match stream.message().await {
            Ok(Some(m)) => messages.push(m.text),
            Ok(None) => return (messages, Ok(())),
            Err(s) => return (messages, Err(s)),
        }
    }
}

/// A `Say` call over a plain HTTP/2 client, so nothing on the client side
/// enforces its `grpc-timeout` (tonic's client would): the `grpc-status`
/// and `grpc-message` of the answer, from its headers or its trailers.
pub async fn raw_say(
    addr: SocketAddr,
    authority: &str,
    headers: &[(&str, &str)],
) -> (Option<String>, Option<String>) {
    use http_body_util::BodyExt;
    let (mut sender, _conn) =
        crate::client::http2::<http_body_util::Full<bytes::Bytes>>(addr).await;
    let message = prost::Message::encode_to_vec(&Echo { text: "raw".into() });
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap_or(0).to_be_bytes());
    frame.extend_from_slice(&message);
    let mut req = http::Request::post(format!("http://{authority}{SAY}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::from(frame)))
        .expect("request");
    let resp = sender.send_request(req).await.expect("response headers");
    let get =
        |h: &http::HeaderMap, n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    if let Some(code) = get(resp.headers(), "grpc-status") {
        return (Some(code), get(resp.headers(), "grpc-message"));
    }
    let collected = resp.into_body().collect().await.expect("the body");
    let trailers = collected.trailers().cloned().unwrap_or_default();
    (
        get(&trailers, "grpc-status"),
        get(&trailers, "grpc-message"),
    )
}
