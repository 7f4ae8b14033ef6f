//! An in-process OTLP collector on loopback: OTLP/HTTP (`POST /v1/traces`,
//! protobuf) and OTLP/gRPC (`TraceService/Export` over h2c) on one port,
//! keeping every span it receives with its resource.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;

const GRPC_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// One span as received.
#[derive(Clone, Debug)]
pub struct Received {
    /// The span.
    pub span: Span,
    /// Its resource's attributes.
    pub resource: Vec<KeyValue>,
    /// `http` or `grpc`: how it arrived.
    pub transport: &'static str,
}

/// A running collector.
pub struct Collector {
    /// Where it listens.
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    /// Starts a collector on an ephemeral loopback port.
    pub async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let store = Arc::clone(&spans);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, Arc::clone(&store)));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Collector { addr, spans }
    }

    /// Every span received so far.
    pub fn all(&self) -> Vec<Received> {
        self.spans.lock().expect("spans").clone()
    }

    /// Waits (at most 10 s) until `n` spans in all have arrived.
    pub async fn wait_for_all(&self, n: usize) -> Vec<Received> {
        for _ in 0..200 {
            let spans = self.all();
            if spans.len() >= n {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "{} spans arrived, wanted {n}: {:#?}",
            self.all().len(),
            self.all()
        );
    }

    /// Spans of trace `trace_id` received so far.
    pub fn trace(&self, trace_id: &[u8]) -> Vec<Received> {
        self.spans
            .lock()
            .expect("spans")
            .iter()
            .filter(|r| r.span.trace_id == trace_id)
            .cloned()
            .collect()
    }

    /// Waits (at most 10 s) until trace `trace_id` has `n` spans.
    pub async fn wait_for(&self, trace_id: &[u8], n: usize) -> Vec<Received> {
        for _ in 0..200 {
            let spans = self.trace(trace_id);
            if spans.len() >= n {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "trace {} has {:?}, wanted {n} spans",
            hex(trace_id),
            self.trace(trace_id)
        );
    }
}

async fn handle(
    req: Request<Incoming>,
    store: Arc<Mutex<Vec<Received>>>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    let path = req.uri().path().to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let reply = ExportTraceServiceResponse::default().encode_to_vec();
    let (message, transport) = match path.as_str() {
        "/v1/traces" => (body, "http"),
        // gRPC framing: a compressed flag (0) and a big-endian length, then the message.
        GRPC_PATH if body.len() >= 5 && body[0] == 0 => (body.slice(5..), "grpc"),
        _ => {
            let mut r = Response::new(Full::new(Bytes::new()).boxed());
            *r.status_mut() = StatusCode::NOT_FOUND;
            return Ok(r);
        }
    };
    let Ok(request) = ExportTraceServiceRequest::decode(message) else {
        let mut r = Response::new(Full::new(Bytes::new()).boxed());
        *r.status_mut() = StatusCode::BAD_REQUEST;
        return Ok(r);
    };
    {
        let mut spans = store.lock().expect("spans");
        for rs in request.resource_spans {
            let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push(Received {
                        span,
                        resource: resource.clone(),
                        transport,
                    });
                }
            }
        }
    }
    let response = if transport == "grpc" {
        let mut framed = vec![0u8];
        framed.extend_from_slice(&u32::try_from(reply.len()).expect("len").to_be_bytes());
        framed.extend_from_slice(&reply);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().expect("value"));
        Response::builder()
            .header("content-type", "application/grpc")
            .body(
                Full::new(Bytes::from(framed))
                    .with_trailers(async move { Some(Ok(trailers)) })
                    .boxed(),
            )
            .expect("response")
    } else {
        Response::builder()
            .header("content-type", "application/x-protobuf")
            .body(Full::new(Bytes::from(reply)).boxed())
            .expect("response")
    };
    Ok(response)
}

/// Lower-case hex of `bytes`, as in `traceparent`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of attribute `key`.
pub fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

/// The string attribute `key`.
pub fn text<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attributes, key) {
        Some(Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

/// The integer attribute `key`.
pub fn int(attributes: &[KeyValue], key: &str) -> Option<i64> {
    match attr(attributes, key) {
        Some(Value::IntValue(i)) => Some(*i),
        _ => None,
    }
}
