//! h2c (prior knowledge) through hyper's HTTP/2 server, running the same
//! script: answers carry the script's status, headers and body; a fault that
//! would end an HTTP/1.1 connection resets the stream instead.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::{received, Action, Inner, ABORT_PARTIAL, ABORT_PAUSE, IDLE};

pub(super) async fn serve_h2(inner: Arc<Inner>, stream: TcpStream) {
    let service = hyper::service::service_fn(move |req| answer_h2(Arc::clone(&inner), req));
    let _ = tokio::time::timeout(
        IDLE,
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), service),
    )
    .await;
}

async fn answer_h2(
    inner: Arc<Inner>,
    req: http::Request<hyper::body::Incoming>,
) -> io::Result<http::Response<Answer>> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    let headers = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut r = received(parts.version, parts.method.to_string(), path, headers);
    r.authority = parts.uri.authority().map(ToString::to_string);
    let (idx, action) = inner.take(r, &body);
    let (wait, action) = action.unwrap_delays();
    tokio::time::sleep(wait).await;
    let (status, extra, body) = match action {
        Action::Reply(status) => (status, Vec::new(), now(inner.default_body())),
        Action::ReplyWith(status, headers, body) => (status, headers, now(body)),
        Action::Echo => (200, Vec::new(), now(body)),
        Action::SlowBody(delay, body) => (200, Vec::new(), timed(vec![(delay, Ok(body))])),
        Action::AbortMidBody => (
            200,
            Vec::new(),
            timed(vec![
                (Duration::ZERO, Ok(Bytes::from_static(ABORT_PARTIAL))),
                (ABORT_PAUSE, Err("aborted mid-body")),
            ]),
        ),
        Action::Hold(d) => {
            tokio::time::sleep(d).await;
            return Err(io::Error::other("held, then the stream is reset"));
        }
        Action::Reset
        | Action::Close
        | Action::HalfClose
        | Action::Stall(_)
        | Action::Delay(_, _) => {
            return Err(io::Error::other("the stream is reset"));
        }
    };
    let mut builder = http::Response::builder().status(status);
    for (k, v) in &extra {
        builder = builder.header(*k, v.as_str());
    }
    let response = builder.body(body).map_err(io::Error::other)?;
    inner.answered(idx);
    Ok(response)
}

/// An HTTP/2 response body.
type Answer = UnsyncBoxBody<Bytes, io::Error>;

/// `body` at once.
fn now(body: Bytes) -> Answer {
    Full::new(body)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Frames, each sent after its wait; an `Err` frame resets the stream.
fn timed(frames: Vec<(Duration, Result<Bytes, &'static str>)>) -> Answer {
    let frames = futures_util::stream::unfold(frames.into_iter(), |mut rest| async move {
        let (wait, frame) = rest.next()?;
        tokio::time::sleep(wait).await;
        Some((frame.map(Frame::data).map_err(io::Error::other), rest))
    });
    StreamBody::new(frames).boxed_unsync()
}
