//! h2c (prior knowledge) through hyper's HTTP/2 server, running the same
//! script: answers carry the script's status, headers and body; a fault that
//! would end an HTTP/1.1 connection resets the stream instead.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
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
) -> io::Result<http::Response<Timed>> {
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
        Action::Reply(status) => (status, Vec::new(), Timed::now(inner.default_body())),
        Action::ReplyWith(status, headers, body) => (status, headers, Timed::now(body)),
        Action::Echo => (200, Vec::new(), Timed::now(body)),
        Action::SlowBody(delay, body) => (200, Vec::new(), Timed::after(delay, body)),
        Action::AbortMidBody => (200, Vec::new(), Timed::aborted()),
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

/// An HTTP/2 response body: frames, each sent after its wait; an `Err` frame
/// resets the stream.
struct Timed {
    frames: VecDeque<(Duration, Result<Bytes, ()>)>,
    length: Option<u64>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Timed {
    fn now(body: Bytes) -> Timed {
        Timed::after(Duration::ZERO, body)
    }

    fn after(wait: Duration, body: Bytes) -> Timed {
        Timed {
            length: Some(body.len() as u64),
            frames: VecDeque::from([(wait, Ok(body))]),
            sleep: None,
        }
    }

    fn aborted() -> Timed {
        Timed {
            length: None,
            frames: VecDeque::from([
                (Duration::ZERO, Ok(Bytes::from_static(ABORT_PARTIAL))),
                (ABORT_PAUSE, Err(())),
            ]),
            sleep: None,
        }
    }
}

impl Body for Timed {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let me = self.get_mut();
        let Some((wait, _)) = me.frames.front() else {
            return Poll::Ready(None);
        };
        let sleep = me
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(*wait)));
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        me.sleep = None;
        Poll::Ready(me.frames.pop_front().map(|(_, frame)| match frame {
            Ok(data) => Ok(Frame::data(data)),
            Err(()) => Err(io::Error::other("aborted mid-body")),
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        self.length
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}
